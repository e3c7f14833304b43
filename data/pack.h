// Sequence packing (data.pack_to): the samples of a micro-batch laid end to end in rows of at most `pack_to`
// tokens, so no compute goes to padding. Each sample stays whole in one row (its image tokens are never split), its
// positions restart at 0 and its attention and MoD routing stay its own (model/segments.h).
//
// The window is the micro-batch: the same samples as the unpacked micro-batch, so a packed step computes the same
// loss, routing loss and gradients (the per-token normalisation over the global batch is unchanged) and the data
// position in a checkpoint means what it means unpacked. Within the window, rows are filled first-fit-decreasing:
// samples by length, longest first (ties in window order), each into the first row it fits; rows keep their
// samples in that placement order. Deterministic: a pure function of the lengths. Should those rows compute more
// positions (rows x longest row) than padding would (samples x longest sample), which a window of a few long samples
// and one short one can do, each sample gets its own row instead: a packed micro-batch never exceeds the padded one,
// so `gmod plan`'s padded worst case (micro_batch x max_len positions) covers packed configs.
#pragma once

#include <cstdint>
#include <vector>

#include "data/batch.h"

namespace gmod {

// Rows of sample indices (into `lengths`) packed first-fit-decreasing into rows of at most `budget` tokens. Throws
// std::invalid_argument when a length is < 1 or > budget (naming the sample by its index) or budget < 1.
std::vector<std::vector<size_t>> pack_first_fit_decreasing(const std::vector<int64_t>& lengths, int64_t budget);

// The packed micro-batch of `samples`: rows as pack_first_fit_decreasing places them, [rows, longest row] tensors,
// positions restarting per sample, the first label of every sample -100 (no token predicts the next sample's
// first token; unpacked, position 0's label is never a target either), images in the order their tokens occur.
// A sample longer than `pack_to` is a std::runtime_error naming it (record id and index, its length, the budget).
Batch collate_packed(std::vector<PreparedSample>& samples, int32_t pad_id, int image_size, int64_t pack_to);

}  // namespace gmod

// Exact-match accuracy of greedy answers, shared by the Trainer's held-out evaluation and `gmod eval`:
// each row's first answer is generated greedily from the prompt before it and compared token by token
// with the reference.
#pragma once

#include <cstdint>
#include <utility>

#include "model/llava.h"

namespace gmod {

// Greedy generation of each row's first answer (the first run of supervised labels) from the prompt before
// it; a hit when the generated tokens equal the reference answer (end-of-turn token included). Rows without a
// supervised token are not counted. `in` needs input_ids, labels, and pixel_values for rows with images
// (pixel_values_videos, video_grid_thw for rows with videos); token_roles are used when present. Returns
// (hits, counted).
std::pair<int64_t, int64_t> first_answer_exact_match(MultimodalLM& model, const ModelInputs& in);

}  // namespace gmod

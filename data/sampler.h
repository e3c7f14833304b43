// Deterministic sample order and its resumable position.
//
// The order of epoch e is a permutation of the global record indices [0, N) that depends only on (seed, e)
// (and, with grouping, on the lengths and the group size) - never on the number of ranks. Global batch g is
// positions [g*G, (g+1)*G) of that permutation. A global batch is consumed in micro-steps of S = world_size *
// micro_batch positions; in micro-step m rank r takes the contiguous slice [m*S + r*mb, m*S + (r+1)*mb).
// Hence after any micro-step the samples consumed by all ranks together are exactly the permutation prefix
// [0, consumed_samples), and DataPosition {epoch, consumed_samples} restores the stream with any world size
// whose S divides consumed_samples (always true at optimizer-step boundaries while G is unchanged). If G
// changes, training continues from consumed_samples of the same permutation (with grouping, the group size is
// part of the order: keep it fixed, it defaults to G). Each epoch uses floor(N / G) * G samples; the
// remainder of the permutation is dropped (a different remainder every epoch).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <vector>

namespace gmod {

struct DataPosition {
  int64_t epoch = 0;
  int64_t consumed_samples = 0;  // global samples consumed in `epoch`, all ranks together

  bool operator==(const DataPosition& o) const {
    return epoch == o.epoch && consumed_samples == o.consumed_samples;
  }
};

nlohmann::json to_json(const DataPosition& p);                  // {"epoch": e, "consumed_samples": c}
DataPosition data_position_from_json(const nlohmann::json& j);  // throws std::runtime_error on bad fields

struct SamplerConfig {
  uint64_t seed = 0;
  int64_t global_batch_size = 1;  // G
  // LLaVA's group_by_modality_length: image and text-only samples in separate groups of `group_size` samples,
  // each sorted by length (longest first), the groups in random order, leftovers of both kinds in one final
  // group.
  bool group_by_modality_length = false;
  int64_t group_size = 0;  // 0: G
};

// Uniform permutation of [0, n) from a seeded splitmix64 stream (Fisher-Yates with unbiased bounded draws).
std::vector<size_t> seeded_permutation(size_t n, uint64_t seed, uint64_t stream);

// The sample order of one epoch: a permutation of [0, N).
// `lengths` (only for grouping): LLaVA convention, > 0 for image samples, < 0 for text-only, |l| ~ length.
std::vector<size_t> epoch_order(size_t num_samples, const SamplerConfig& config, int64_t epoch,
                                const std::vector<int64_t>& lengths = {});

}  // namespace gmod

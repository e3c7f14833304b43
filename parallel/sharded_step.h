// The parts of an optimizer step that ZeRO-0/1/2 (DataParallelOptimizer) and ZeRO-3 (Zero3Optimizer) share,
// written once so that the two stay bitwise alike: the global gradient norm with the skip-on-non-finite
// verdict and global-norm clipping around ShardedAdamW's update, the weight-decay ranges from per-parameter
// flags, and the checkpointable AdamWShardState of a rank (and loading one back).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "parallel/comm.h"
#include "parallel/data_parallel.h"
#include "parallel/flat_params.h"
#include "parallel/sharded_adamw.h"

namespace gmod {

// grad: this rank's averaged fp32 gradient of adam's range. Norm = sqrt of the sum of every rank's squared
// norm (summed over `sum_over`; nullptr: this rank holds the whole gradient, stage 0); a non-finite gradient
// on any rank skips the update everywhere (result.skipped, nothing changed); else grad is scaled by max_norm
// / (norm + 1e-6) when that is < 1 (max_grad_norm > 0) and adam steps with it.
// lrs: one learning rate per parameter group of adam (ShardedAdamW::set_groups).
StepResult clip_and_step(ShardedAdamW& adam, at::Tensor& grad, Comm* sum_over, double max_grad_norm,
                         const std::vector<double>& lrs);

// [offset, offset + numel) of every parameter flagged true (flags in layout order; sizes must match).
std::vector<std::pair<int64_t, int64_t>> decay_ranges(const FlatParamLayout& layout,
                                                      const std::vector<bool>& decay);

// Groups per parameter (layout order; empty = all in group 0) and each group's weight decay (empty = one group
// with `weight_decay`) installed into adam (ShardedAdamW::set_groups); `who` prefixes a size mismatch error.
void set_param_groups(ShardedAdamW& adam, const FlatParamLayout& layout, const std::vector<int>& group,
                      const std::vector<double>& group_weight_decay, double weight_decay, const std::string& who);

// The state of `adam` as rank `rank` of a stage-`stage` job over `layout` (tensors alias the live state).
AdamWShardState shard_state(const ShardedAdamW& adam, const FlatParamLayout& layout, int stage, int rank);
// Loads `s` into adam after checking it was saved for the same parameters; `who` prefixes the error.
void load_shard_state(ShardedAdamW& adam, const FlatParamLayout& layout, const AdamWShardState& s,
                      const std::string& who);

}  // namespace gmod

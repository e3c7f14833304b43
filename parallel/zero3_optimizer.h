// Zero3Optimizer: the step of ZeRO-3 over Zero3Params + Zero3Grads (parallel/zero3_driver.h drives it). The same
// arithmetic as DataParallelOptimizer::step at stage 2 on the same shard range (parallel/sharded_step.h):
// global gradient norm (sum of every rank's squared shard norm), every rank skips on a non-finite gradient
// anywhere, global- norm clipping, ShardedAdamW on the fp32 master + moments of the shard; the updated master
// is written into the bf16/fp32 parameter shard (no all-gather: the next forward gathers the units). So its
// parameters and optimizer state are bitwise those of ZeRO-2, and its AdamWShardState is a stage-2 one
// (checkpoints reshard as they do).
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "parallel/data_parallel.h"
#include "parallel/sharded_adamw.h"
#include "parallel/zero3_grads.h"
#include "parallel/zero3_params.h"

namespace gmod {

class Zero3Optimizer {
 public:
  // decay: per parameter (order of params.params()), true = weight decay applies; empty = every parameter.
  // group, group_weight_decay: parameter groups as DataParallelOptions has them (empty = one group).
  Zero3Optimizer(Zero3Params& params, Zero3Grads& grads, AdamWHyper hyper, double max_grad_norm,
                 const std::vector<bool>& decay = {}, const std::vector<int>& group = {},
                 const std::vector<double>& group_weight_decay = {});
  // Collective. Uses grads.shard_grad() (every unit reduced), then zeroes it. lrs: one per parameter group.
  StepResult step(const std::vector<double>& lrs);
  StepResult step(double lr) { return step(std::vector<double>{lr}); }
  // Stage-2 state of this rank (tensors alias the live state).
  AdamWShardState state_dict() const;
  // Loads a state covering exactly this rank's range (reshard_state(saved, world, rank, 2) from any stage and
  // world size) and writes its master into the parameter shard (gathered units are refreshed by their next
  // gather).
  void load_state_dict(const AdamWShardState& state);
  int64_t step_count() const { return adam_->step_count(); }
  int64_t host_bytes() const { return adam_->host_bytes(); }  // offload: master + moments in host memory

 private:
  Zero3Params& params_;
  Zero3Grads& grads_;
  double max_grad_norm_;
  std::unique_ptr<ShardedAdamW> adam_;
};

}  // namespace gmod

#include "parallel/zero3_optimizer.h"

#include <c10/core/GradMode.h>

#include "parallel/sharded_step.h"

namespace gmod {

Zero3Optimizer::Zero3Optimizer(Zero3Params& params, Zero3Grads& grads, AdamWHyper hyper, double max_grad_norm,
                               const std::vector<bool>& decay, const std::vector<int>& group,
                               const std::vector<double>& group_weight_decay)
    : params_(params), grads_(grads), max_grad_norm_(max_grad_norm) {
  const FlatParamLayout& layout = params_.layout();
  const auto [begin, end] = layout.shard_range(params_.comm().rank());
  adam_ = std::make_unique<ShardedAdamW>(begin, end, params_.shard(), hyper);
  if (!decay.empty()) adam_->set_decay_ranges(decay_ranges(layout, decay));
  set_param_groups(*adam_, layout, group, group_weight_decay, hyper.weight_decay, "parallel/zero3_optimizer");
}

StepResult Zero3Optimizer::step(const std::vector<double>& lrs) {
  // As DataParallelOptimizer::step at stage 2 (parallel/sharded_step.h); the master goes into the parameter
  // shard (the next forward gathers it).
  const StepResult res = clip_and_step(*adam_, grads_.shard_grad(), &params_.comm(), max_grad_norm_, lrs);
  c10::NoGradGuard no_grad;
  if (!res.skipped) adam_->copy_master_to(params_.shard());
  grads_.zero_shard_grad();
  return res;
}

AdamWShardState Zero3Optimizer::state_dict() const {
  return shard_state(*adam_, params_.layout(), 2, params_.comm().rank());
}

void Zero3Optimizer::load_state_dict(const AdamWShardState& state) {
  load_shard_state(*adam_, params_.layout(), state, "parallel/zero3_optimizer");
  c10::NoGradGuard no_grad;
  adam_->copy_master_to(params_.shard());
}

}  // namespace gmod

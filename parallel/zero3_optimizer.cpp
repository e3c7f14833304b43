#include "parallel/zero3_optimizer.h"

#include <c10/core/GradMode.h>

#include <cmath>
#include <stdexcept>

namespace gmod {

Zero3Optimizer::Zero3Optimizer(Zero3Params& params, Zero3Grads& grads, AdamWHyper hyper, double max_grad_norm,
                               const std::vector<bool>& decay)
    : params_(params), grads_(grads), max_grad_norm_(max_grad_norm) {
  const FlatParamLayout& layout = params_.layout();
  if (!decay.empty() && decay.size() != layout.entries().size())
    throw std::runtime_error("parallel/zero3_optimizer: " + std::to_string(decay.size()) +
                             " decay flags for " + std::to_string(layout.entries().size()) + " parameters");
  const auto [begin, end] = layout.shard_range(params_.comm().rank());
  adam_ = std::make_unique<ShardedAdamW>(begin, end, params_.shard(), hyper);
  if (!decay.empty()) {
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (size_t i = 0; i < decay.size(); ++i) {
      const FlatParamEntry& e = layout.entries()[i];
      if (decay[i] && e.numel > 0) ranges.emplace_back(e.offset, e.offset + e.numel);
    }
    adam_->set_decay_ranges(std::move(ranges));
  }
}

StepResult Zero3Optimizer::step(double lr) {
  c10::NoGradGuard no_grad;
  at::Tensor g = grads_.shard_grad();
  StepResult res;
  // As DataParallelOptimizer::step (stage > 0): [sum of squares, non-finite flag] summed over ranks.
  at::Tensor norm = at::linalg_vector_norm(g, 2).to(at::kDouble);
  at::Tensor t = at::stack({norm * norm, at::logical_not(at::isfinite(norm)).to(at::kDouble)});
  params_.comm().all_reduce(t, ReduceOp::Sum);
  t = t.cpu();
  const double sq = t[0].item<double>();
  const bool bad = t[1].item<double>() > 0 || !std::isfinite(sq);
  res.grad_norm = std::sqrt(sq);
  if (bad) {
    res.skipped = true;
    grads_.zero_shard_grad();
    return res;
  }
  if (max_grad_norm_ > 0) {
    const double coef = max_grad_norm_ / (res.grad_norm + 1e-6);
    if (coef < 1.0) {
      g.mul_(coef);
      res.clipped = true;
    }
  }
  adam_->step(g, lr);
  params_.shard().copy_(adam_->master());
  grads_.zero_shard_grad();
  return res;
}

AdamWShardState Zero3Optimizer::state_dict() const {
  AdamWShardState s;
  s.layout = params_.layout();
  s.stage = 2;
  s.rank = params_.comm().rank();
  s.begin = adam_->begin();
  s.end = adam_->end();
  s.step = adam_->step_count();
  s.master = adam_->master();
  s.exp_avg = adam_->exp_avg();
  s.exp_avg_sq = adam_->exp_avg_sq();
  return s;
}

void Zero3Optimizer::load_state_dict(const AdamWShardState& state) {
  if (!state.layout.same_params(params_.layout()))
    throw std::runtime_error(
        "parallel/zero3_optimizer: optimizer state was saved for different parameters (names, "
        "shapes or order differ)");
  c10::NoGradGuard no_grad;
  adam_->load(state);
  params_.shard().copy_(adam_->master());
}

}  // namespace gmod

#include "parallel/sharded_step.h"

#include <c10/core/GradMode.h>

#include <cmath>
#include <stdexcept>

namespace gmod {

StepResult clip_and_step(ShardedAdamW& adam, at::Tensor& grad, Comm* sum_over, double max_grad_norm,
                         const std::vector<double>& lrs) {
  c10::NoGradGuard no_grad;
  StepResult res;
  // [sum of squares, non-finite flag] of our part of the averaged gradient. Padding is zero and adds nothing.
  at::Tensor norm = at::linalg_vector_norm(grad, 2).to(at::kDouble);
  at::Tensor t = at::stack({norm * norm, at::logical_not(at::isfinite(norm)).to(at::kDouble)});
  if (sum_over) sum_over->all_reduce(t, ReduceOp::Sum);
  t = t.cpu();
  const double sq = t[0].item<double>();
  const bool bad = t[1].item<double>() > 0 || !std::isfinite(sq);
  res.grad_norm = std::sqrt(sq);
  if (bad) {
    res.skipped = true;
    return res;
  }
  if (max_grad_norm > 0) {
    const double coef = max_grad_norm / (res.grad_norm + 1e-6);
    if (coef < 1.0) {
      grad.mul_(coef);
      res.clipped = true;
    }
  }
  adam.step(grad, lrs);
  return res;
}

std::vector<std::pair<int64_t, int64_t>> decay_ranges(const FlatParamLayout& layout,
                                                      const std::vector<bool>& decay) {
  if (decay.size() != layout.entries().size())
    throw std::runtime_error("parallel/sharded_step: " + std::to_string(decay.size()) + " decay flags for " +
                             std::to_string(layout.entries().size()) + " parameters");
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (size_t i = 0; i < decay.size(); ++i) {
    const FlatParamEntry& e = layout.entries()[i];
    if (decay[i] && e.numel > 0) ranges.emplace_back(e.offset, e.offset + e.numel);
  }
  return ranges;
}

void set_param_groups(ShardedAdamW& adam, const FlatParamLayout& layout, const std::vector<int>& group,
                      const std::vector<double>& group_weight_decay, double weight_decay, const std::string& who) {
  if (group.empty() && group_weight_decay.empty()) return;
  if (!group.empty() && group.size() != layout.entries().size())
    throw std::runtime_error(who + ": " + std::to_string(group.size()) + " group indices for " +
                             std::to_string(layout.entries().size()) + " parameters");
  std::vector<double> wd = group_weight_decay.empty() ? std::vector<double>{weight_decay} : group_weight_decay;
  std::vector<ShardedAdamW::GroupRange> ranges;
  for (size_t i = 0; i < group.size(); ++i) {
    const FlatParamEntry& e = layout.entries()[i];
    if (group[i] < 0 || group[i] >= int(wd.size()))
      throw std::runtime_error(who + ": parameter '" + e.name + "' is in group " + std::to_string(group[i]) +
                               " of " + std::to_string(wd.size()));
    if (group[i] != 0 && e.numel > 0) ranges.push_back({e.offset, e.offset + e.numel, group[i]});
  }
  adam.set_groups(ranges, std::move(wd));
}

AdamWShardState shard_state(const ShardedAdamW& adam, const FlatParamLayout& layout, int stage, int rank) {
  AdamWShardState s;
  s.layout = layout;
  s.stage = stage;
  s.rank = rank;
  s.begin = adam.begin();
  s.end = adam.end();
  s.step = adam.step_count();
  s.master = adam.master();
  s.exp_avg = adam.exp_avg();
  s.exp_avg_sq = adam.exp_avg_sq();
  return s;
}

void load_shard_state(ShardedAdamW& adam, const FlatParamLayout& layout, const AdamWShardState& s,
                      const std::string& who) {
  if (!s.layout.same_params(layout))
    throw std::runtime_error(who +
                             ": optimizer state was saved for different parameters (names, shapes or order "
                             "differ)");
  c10::NoGradGuard no_grad;
  adam.load(s);
}

}  // namespace gmod

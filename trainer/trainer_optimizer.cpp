// Trainer: the optimizer's set-up (the data-parallel strategy of parallel/dp_strategy.h, whichever ZeRO stage
// runs it; at ZeRO-3 it also gathers the model's parameters around each unit, so that model weights are only
// complete inside DpStrategy::with_full_params) and the learning rates of the parameter groups.
#include <sstream>

#include "model/unit_hooks.h"
#include "trainer/trainer.h"

namespace gmod {

void Trainer::setup_optimizer() {
  const OptimizerSection& c = cfg_.optimizer;
  DpSettings settings = plan_.data_parallel;  // the optimizer section, resolved (trainer/run_plan.h)
  DataParallelOptions& o = settings.options;
  // Weight decay by name (HF Trainer / LLaVA: not on biases and norm weights); parallel/ only sees the flags.
  int64_t decayed = 0, excluded = 0;
  int excluded_tensors = 0;
  for (const auto& [name, p] : trainable_) {
    const bool d = decays_weight(name, c.no_decay);
    o.decay.push_back(d);
    (d ? decayed : excluded) += p.numel();
    excluded_tensors += d ? 0 : 1;
  }
  // optimizer.groups: each trainable parameter's group and each group's weight decay (trainer/config/param_groups.h).
  if (param_groups_.grouped()) {
    o.group = trainable_group_;
    for (const ResolvedGroup& g : param_groups_.groups) o.group_weight_decay.push_back(g.weight_decay);
    for (const ResolvedGroup& g : param_groups_.groups) {
      std::ostringstream line;
      line << "optimizer: group " << g.name << " (" << g.key << "): ";
      if (g.freeze)
        line << "frozen, " << g.frozen_params << " parameters";
      else
        line << "lr " << g.lr << ", weight decay " << g.weight_decay << ", " << g.params << " parameters in "
             << g.tensors << " tensors" << (g.frozen_params ? ", " + std::to_string(g.frozen_params) + " frozen" : "");
      print(line.str());
    }
  }
  // Frozen parameters are not in the optimizer; they are identical on every rank by construction (same files
  // or same init seed). The trainable ones start from rank 0's values.
  dp_ = make_dp_strategy(settings, trainable_, comm_, hooked_units(*model_));
  std::ostringstream wd;
  wd << c.weight_decay;
  if (c.weight_decay > 0)
    print("optimizer: weight decay " + wd.str() + " on " + std::to_string(decayed) + " parameters; " +
          std::to_string(excluded) + " in " + std::to_string(excluded_tensors) +
          " tensors excluded (optimizer.no_decay)");
  print(dp_->describe());
}

std::vector<double> Trainer::group_lrs() const {
  if (!param_groups_.grouped()) return {sched_->current()};
  std::vector<double> lrs;
  for (const ResolvedGroup& g : param_groups_.groups) lrs.push_back(g.freeze ? 0.0 : sched_->lr_at(sched_->step(), g.lr));
  return lrs;
}

}  // namespace gmod

// Trainer: the optimizer's set-up and the few calls through which the loop, the checkpoint save and the
// resume reach it, whichever ZeRO stage runs it (stages 0-2: DataParallelOptimizer; stage 3: Zero3Driver,
// which also gathers the model's parameters around each unit, so that model weights are only complete inside
// with_full_params).
#include <sstream>

#include "trainer/trainer.h"
#include "trainer/zero3_driver.h"

namespace gmod {

void Trainer::setup_optimizer() {
  const OptimizerSection& c = cfg_.optimizer;
  DataParallelOptions o;
  o.stage = c.zero_stage;
  o.lr = c.lr;
  o.beta1 = c.beta1;
  o.beta2 = c.beta2;
  o.eps = c.eps;
  o.weight_decay = c.weight_decay;
  o.max_grad_norm = c.max_grad_norm;
  o.bucket_bytes = int64_t(c.bucket_mb) << 20;
  o.reduce_dtype = effective_reduce_dtype(cfg_) == "bf16" ? at::kBFloat16 : at::kFloat;
  o.overlap_comm = c.overlap_comm;
  o.accumulate_fp32 = c.accumulate_fp32;
  o.offload = c.offload == "cpu";
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
  if (o.stage == 3) {
    o.stage = 2;  // the arithmetic and state format of stage 2 (parallel/zero3_optimizer.h)
    z3_ = std::make_unique<Zero3Driver>(*model_, trainable_, comm_, o, c.zero3_prefetch,
                                        c.zero3_reshard_after_forward);
    print("optimizer: ZeRO-3, " + std::to_string(z3_->num_units()) + " parameter units (" +
          std::to_string(z3_->num_hooked_units()) +
          " gathered around their forward and backward), prefetch " + std::to_string(z3_->prefetch()) +
          (z3_->reshard_after_forward() ? "" : ", no reshard after forward") +
          (o.offload ? "; fp32 master + moments offloaded to host memory" : ""));
  } else {
    opt_ = std::make_unique<DataParallelOptimizer>(trainable_, comm_, o);
    opt_->broadcast_params(0);
  }
  std::ostringstream wd;
  wd << c.weight_decay;
  if (c.weight_decay > 0)
    print("optimizer: weight decay " + wd.str() + " on " + std::to_string(decayed) + " parameters; " +
          std::to_string(excluded) + " in " + std::to_string(excluded_tensors) +
          " tensors excluded (optimizer.no_decay)");
  if (z3_) return;
  const int64_t n = decayed + excluded;
  auto mib = [](int64_t b) { return std::to_string((b + (1 << 19)) >> 20) + " MiB"; };
  const DpMemory during = DataParallelOptimizer::memory_plan(n, world_, dtype_, o, false);
  const DpMemory at_step = DataParallelOptimizer::memory_plan(n, world_, dtype_, o, true);
  print("optimizer: ZeRO-" + std::to_string(o.stage) + ", gradients + optimizer state per rank " +
        mib(during.total()) + " during backward, " + mib(at_step.total()) + " in step() (fp32 state " +
        mib(at_step.optimizer_state) + ", fp32 averaged gradient " + mib(at_step.reduced_grad) + ")" +
        (o.offload ? "; offloaded to host memory: fp32 master + moments " + mib(at_step.host_state) : ""));
}

DataParallelOptimizer& Trainer::optimizer() {
  if (!opt_)
    throw std::logic_error(
        "Trainer::optimizer(): ZeRO-3 runs through Zero3Driver, not DataParallelOptimizer");
  return *opt_;
}

std::vector<double> Trainer::group_lrs() const {
  if (!param_groups_.grouped()) return {sched_->current()};
  std::vector<double> lrs;
  for (const ResolvedGroup& g : param_groups_.groups) lrs.push_back(g.freeze ? 0.0 : sched_->lr_at(sched_->step(), g.lr));
  return lrs;
}

StepResult Trainer::optimizer_step(const std::vector<double>& lrs) {
  if (z3_) return z3_->step(lrs);
  const StepResult r = opt_->step(lrs);
  opt_->zero_grad();
  return r;
}

const FlatParamLayout& Trainer::optimizer_layout() const { return z3_ ? z3_->layout() : opt_->layout(); }

AdamWShardState Trainer::optimizer_state() const { return z3_ ? z3_->state_dict() : opt_->state_dict(); }

void Trainer::load_optimizer_state(const AdamWShardState& s) {
  if (z3_)
    z3_->load_state_dict(s);
  else
    opt_->load_state_dict(s);
}

void Trainer::with_full_params(const std::function<void()>& fn) {
  if (!z3_) return fn();
  z3_->gather_all();
  try {
    fn();
  } catch (...) {
    z3_->release_all();
    throw;
  }
  z3_->release_all();
}

}  // namespace gmod

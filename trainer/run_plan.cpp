#include "trainer/run_plan.h"

#include <utility>

namespace gmod {

RunPlan resolve_run_plan(TrainConfig config, int world) {
  RunPlan p;
  p.config = std::move(config);
  const TrainConfig& c = p.config;
  p.world = world;
  p.dtype = c.model.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  p.grad_accum = grad_accum_steps(c, world);
  p.global_batch = int64_t(p.grad_accum) * world * c.batch.micro_batch;

  const OptimizerSection& s = c.optimizer;
  DpSettings& dp = p.data_parallel;
  dp.zero_stage = s.zero_stage;
  dp.zero3_prefetch = s.zero3_prefetch;
  dp.zero3_reshard_after_forward = s.zero3_reshard_after_forward;
  DataParallelOptions& o = dp.options;
  o.lr = s.lr;
  o.beta1 = s.beta1;
  o.beta2 = s.beta2;
  o.eps = s.eps;
  o.weight_decay = s.weight_decay;
  o.max_grad_norm = s.max_grad_norm;
  o.bucket_bytes = int64_t(s.bucket_mb) << 20;
  o.reduce_dtype = effective_reduce_dtype(c) == "bf16" ? at::kBFloat16 : at::kFloat;
  o.overlap_comm = s.overlap_comm;
  o.accumulate_fp32 = s.accumulate_fp32;
  o.offload = s.offload == "cpu";

  p.checkpointing = parse_activation_checkpointing(c.model.activation_checkpointing);
  p.profile_steps = parse_step_range(c.metrics.profile_steps, "metrics.profile_steps");
  return p;
}

RunPlan read_run_plan(const std::string& path, const std::vector<std::string>& overrides, int world,
                      int ranks_on_node) {
  return resolve_run_plan(read_valid_train_config(path, overrides, world, ranks_on_node), world);
}

}  // namespace gmod

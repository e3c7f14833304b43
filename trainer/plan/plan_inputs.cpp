// plan_inputs_from_plan: what `gmod plan` and the trainer's start-up plan read from a resolved run plan
// (trainer/run_plan.h: the same keys, checks and derived settings as `gmod train`) into MemoryPlanInputs
// (trainer/plan/memory_plan.h); plan_inputs_from_config resolves a parsed config first.
#include <algorithm>
#include <string>
#include <vector>

#include "mod/conversion.h"
#include "model/activation_checkpoint.h"
#include "trainer/config/train_config.h"
#include "trainer/plan/memory_plan.h"
#include "trainer/run_plan.h"

namespace gmod {

MemoryPlanInputs plan_inputs_from_config(const TrainConfig& cfg, const LlavaConfig& model, int world,
                                         const VisualInputs& visual) {
  return plan_inputs_from_plan(resolve_run_plan(cfg, world), model, visual);
}

MemoryPlanInputs plan_inputs_from_plan(const RunPlan& plan, const LlavaConfig& model, const VisualInputs& visual) {
  const TrainConfig& cfg = plan.config;
  MemoryPlanInputs in;
  in.model = model;
  in.world = plan.world;
  in.stage = plan.data_parallel.zero_stage;
  in.offload = cfg.optimizer.offload;
  in.dtype = cfg.model.dtype;
  in.micro_batch = cfg.batch.micro_batch;
  in.seq_len = cfg.data.max_len;
  const auto tc = tower_costs(model);
  in.images_per_sample = model.vision || tc ? 1 : 0;
  in.visual = visual;
  // LLM tokens of one image: fixed for the CLIP family, from the tower's cost model for variable grids, the largest
  // pinpoint's for AnyRes (base + its whole grid + newlines, model/anyres_grid.h).
  const int64_t image_tokens = tc ? tc->llm_tokens(visual) : anyres_image_bound(model).tokens;
  in.train_vision = !cfg.freeze.vision;
  in.train_projector = !cfg.freeze.projector;
  in.train_llm = !cfg.freeze.llm;
  in.frozen_llm_layers = parse_layer_ranges(cfg.freeze.llm_layers, model.text.num_hidden_layers);
  in.bucket_bytes = plan.data_parallel.options.bucket_bytes;
  in.grad_accum = plan.grad_accum;
  in.overlap_comm = plan.data_parallel.options.overlap_comm;
  in.device = cfg.model.device;
  if (cfg.mod.enabled) {
    // Layers chosen at run time (Trainer::convert_model) are planned by their number: ARank-based rules get a
    // stand-in ARank that decreases with depth (keep_top:k keeps layers 0..k-1 dense); threshold rules are planned
    // as arank_mod.
    const int n = model.text.num_hidden_layers;
    const std::string rule = cfg.mod.rule.rfind("threshold:", 0) == 0 ? "arank_mod" : cfg.mod.rule;
    std::vector<double> arank(static_cast<size_t>(n), 0.0);
    for (int l = 0; l < n; ++l) arank[size_t(l)] = double(n - l);
    const MoDConfig mc = config_for_rule(rule, cfg.mod.config, n, arank);
    in.mod_layers = mc.mod_layers;
    in.mod_rule = cfg.mod.rule;
    in.mod_router = to_string(mc.router);
    // Routable = image tokens (+ a short system prefix, ignored); what each MoD layer keeps of a sample is mod/'s
    // to say (planned_kept_fractions: skip_frac of the routable tokens skipped; p-MoD: its ratio of them kept).
    const double routable = std::min(1.0, double(image_tokens) / double(in.seq_len));
    const std::vector<double> kept = planned_kept_fractions(mc, n, routable);
    in.mod_kept_fraction = kept.empty() ? 1.0 - mc.skip_frac * routable : *std::max_element(kept.begin(), kept.end());
    if (std::any_of(kept.begin(), kept.end(), [&](double k) { return k != kept.front(); })) in.mod_kept_by_layer = kept;
  }
  // model.activation_checkpointing as gmod train reads it ("none" | "full" | "every_<k>",
  // model/activation_checkpoint.h), in the plan's terms.
  const ActivationCheckpointing& ac = plan.checkpointing;
  in.checkpointing = ac.every == 0 ? "none" : ac.every == 1 ? "full" : "every_k";
  if (ac.every > 1) in.checkpoint_every = ac.every;
  in.zero3_prefetch = plan.data_parallel.zero3_prefetch;
  in.async_checkpoint = cfg.checkpoint.async && cfg.checkpoint.every > 0;
  in.accumulate_fp32 = plan.data_parallel.options.accumulate_fp32;
  in.zero3_reshard_after_forward = plan.data_parallel.zero3_reshard_after_forward;
  in.reduce_dtype = effective_reduce_dtype(cfg);
  in.lora_r = cfg.lora.r;
  in.lora_targets = cfg.lora.targets;
  in.lora_dropout = cfg.lora.dropout;
  return in;
}

}  // namespace gmod

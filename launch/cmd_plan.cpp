// `gmod plan CONFIG`: the per-rank memory and communication plan of a training config
// (trainer/plan/memory_plan.h): bytes of weights, gradients, optimizer state, activations and transients at the
// step's peak, every phase's total, the bytes communicated per optimizer step, and whether it fits a per-GPU
// budget. Prints a table, and the same as JSON with --json FILE ("-" = stdout). Nothing is allocated: it runs
// on a laptop for a 13B model (with optimizer.groups the model is built without weights to match their patterns
// against its parameter names: address space, no memory; trainer/plan/param_group_counts.h).
#include <fstream>
#include <optional>
#include <iostream>
#include <nlohmann/json.hpp>

#include "launch/args.h"
#include "model/config.h"
#include "trainer/config/param_groups.h"
#include "trainer/plan/memory_plan.h"
#include "trainer/plan/param_group_counts.h"
#include "trainer/model_setup.h"
#include "trainer/config/train_config.h"
#include "trainer/run_plan.h"

namespace gmod::cli {
namespace {

using json = nlohmann::json;

struct PlanOptions {
  std::string config;
  int world = 1;
  std::optional<double> gpu_mem, reserve_gb;
  std::optional<std::string> checkpointing;
  std::optional<int> checkpoint_every, images;
  std::optional<int64_t> max_pixels, frames;
  std::optional<double> mod_kept;
  std::string model, json;
  std::vector<std::string> sets;
};

// For towers of variable grids: each visual input's size, patches and LLM tokens (tower_costs.h).
std::string visual_note(const LlavaConfig& model, const MemoryPlanInputs& in) {
  const auto tc = tower_costs(model);
  if (!tc || in.images_per_sample == 0) return "";
  return ", each visual input max_pixels " + std::to_string(in.visual.max_pixels) + " x " + std::to_string(in.visual.frames) +
         " frame(s): " + std::to_string(tc->patches(in.visual)) + " encoder patches, " +
         std::to_string(tc->llm_tokens(in.visual)) + " LLM tokens";
}

int run_plan(const PlanOptions& o) {
  const std::string& path = o.config;
  std::ifstream f(path);
  if (!f) throw std::runtime_error(path + ": cannot open the training config");
  json raw;
  try {
    raw = json::parse(f, nullptr, true, /*ignore_comments=*/true);
  } catch (const json::exception& e) {
    throw std::runtime_error(path + ": not valid JSON: " + e.what());
  }
  TrainConfig cfg = train_config_from_json(raw, o.sets, path);  // the keys and checks of `gmod train`
  if (!o.model.empty()) {  // a combined HF-style config dir instead of the config's model
    cfg.model.path = o.model;
    cfg.model.llm.clear(), cfg.model.vision.clear(), cfg.model.projector.clear(), cfg.model.vision_slow.clear();
  }
  if (cfg.model.path.empty() && cfg.model.llm.empty())
    throw std::invalid_argument(path + ": neither model.path nor model.llm is set (or pass --model DIR)");
  const LlavaConfig model = run_model_config(cfg.model);  // the combined dir's config, or the parts' composition
  const int world = o.world;

  if (const auto errs = check_config_fits_model(cfg, model, describe_model_source(cfg.model));
      !errs.empty()) {
    std::string msg = path + ": " + std::to_string(errs.size()) + " problem(s) with this model:";
    for (const auto& x : errs) msg += "\n  " + x;
    throw std::invalid_argument(msg);
  }
  // Resolved as `gmod train` resolves it (trainer/run_plan.h), without the data checks: a plan needs no data files.
  const RunPlan plan = resolve_run_plan(cfg, world);
  VisualInputs visual;
  if (o.max_pixels) visual.max_pixels = *o.max_pixels;
  if (o.frames) visual.frames = *o.frames;
  MemoryPlanInputs in = plan_inputs_from_plan(plan, model, visual);
  if (o.checkpointing) in.checkpointing = *o.checkpointing;
  if (o.checkpoint_every) in.checkpoint_every = *o.checkpoint_every;
  if (o.images) in.images_per_sample = *o.images;
  if (o.mod_kept) in.mod_kept_fraction = *o.mod_kept;
  constexpr double GB = double(int64_t(1) << 30);  // GiB, as nvidia-smi reports "80 GB" cards
  if (o.gpu_mem) {
    in.budget_bytes = *o.gpu_mem * GB;
    // CUDA context, NCCL and cuBLAS workspaces, caching-allocator fragmentation: not derived, an allowance.
    in.reserve_bytes = o.reserve_gb.value_or(4.0) * GB;
  } else if (o.reserve_gb) {
    in.reserve_bytes = *o.reserve_gb * GB;
  }
  // optimizer.groups: resolved against the model's parameter names (built without weights), as gmod train does.
  std::optional<PlanParamGroups> groups;
  if (!effective_param_groups(cfg.optimizer).empty()) {
    if (const auto errs = check_param_groups(cfg.optimizer); !errs.empty()) {
      std::string msg = path + ": " + std::to_string(errs.size()) + " problem(s):";
      for (const auto& x : errs) msg += "\n  " + x;
      throw std::invalid_argument(msg);
    }
    groups = plan_param_groups(cfg, model, in.mod_layers);
    in.frozen_by_groups = groups->frozen_by_groups;
  }
  const MemoryPlan p = plan_memory(in);

  std::cout << "plan: " << path << " (model " << describe_model_source(cfg.model) << "), world " << world << ", ZeRO-"
            << in.stage << ", " << in.dtype << ", micro-batch " << in.micro_batch << " x " << in.seq_len
            << " tokens"
            << (in.images_per_sample > 0 ? " (" + std::to_string(in.images_per_sample) + " image/sample)"
                                         : "")
            << visual_note(model, in)
            << ", checkpointing " << in.checkpointing
            << (in.checkpointing == "every_k" ? " k=" + std::to_string(in.checkpoint_every) : "")
            << (in.mod_layers.empty()
                    ? ", dense"
                    : ", " + std::to_string(in.mod_layers.size()) + " MoD layers keeping " +
                          (in.mod_kept_by_layer.empty()
                               ? std::to_string(in.mod_kept_fraction).substr(0, 5)
                               : std::to_string(in.mod_kept_by_layer.front()).substr(0, 5) + " down to " +
                                     std::to_string(in.mod_kept_by_layer.back()).substr(0, 5) + " (by depth)") +
                          " of the tokens")
            << ", grad accumulation " << in.grad_accum
            << (in.stage == 3 ? ", prefetch " + std::to_string(in.zero3_prefetch) : "")
            << (in.offload != "none" ? ", optimizer offload " + in.offload : "") << "\n"
            << (cfg.data.pack_to > 0
                    ? "packing: rows of at most " + std::to_string(cfg.data.pack_to) +
                          " tokens (data.pack_to), planned as the padded worst case above: a packed micro-batch never "
                          "computes more positions than its padded one (data/pack.h)\n"
                    : std::string())
            << "\n"
            << format_plan(p);
  if (groups) {
    std::cout << "\n" << format_param_groups(groups->groups);
    for (const auto& w : groups->problems) std::cout << "warning: " << w << " (gmod train refuses this)\n";
  }
  if (!o.json.empty()) {
    const std::string* j = &o.json;
    json out = to_json(p);
    out["inputs"] = {{"config", path},
                     {"model", describe_model_source(cfg.model)},
                     {"world", world},
                     {"zero_stage", in.stage},
                     {"dtype", in.dtype},
                     {"micro_batch", in.micro_batch},
                     {"pack_to", cfg.data.pack_to},
                     {"seq_len", in.seq_len},
                     {"images_per_sample", in.images_per_sample},
                     {"max_pixels", in.visual.max_pixels},
                     {"frames", in.visual.frames},
                     {"checkpointing", in.checkpointing},
                     {"checkpoint_every", in.checkpoint_every},
                     {"mod_layers", in.mod_layers},
                     {"mod_kept_fraction", in.mod_kept_fraction},
                     {"mod_kept_by_layer", in.mod_kept_by_layer},
                     {"accumulate_fp32", in.accumulate_fp32},
                     {"reduce_dtype", in.reduce_dtype},
                     {"grad_accum", in.grad_accum},
                     {"offload", in.offload},
                     {"zero3_prefetch", in.zero3_prefetch}};
    if (groups) out["param_groups"] = groups->groups.to_json();
    if (*j == "-") {
      std::cout << out.dump(2) << "\n";
    } else {
      std::ofstream o(*j);
      if (!o) throw std::runtime_error(*j + ": cannot write");
      o << out.dump(2) << "\n";
      std::cout << "wrote " << *j << "\n";
    }
  }
  return in.budget_bytes > 0 && !p.fits ? 3 : 0;
}

Runner setup_plan(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  app.footer("Exit code 3 when --gpu-mem is given and the plan does not fit it. docs/plan.md explains the terms.");
  add(app, "config", o->config, "training config (configs/*.json, JSON with comments)")->type_name("CONFIG")->required();
  add(app, "--world", o->world, "ranks (GPUs)")->check(positive());
  add(app, "--gpu-mem", o->gpu_mem, "per-GPU memory budget; the verdict says whether the plan fits")
      ->type_name("GiB")
      ->check(positive());
  add(app, "--reserve-gb", o->reserve_gb,
      "allowance for the CUDA context, NCCL/cuBLAS workspaces and fragmentation (default 4 with --gpu-mem, else 0)")
      ->type_name("GiB")
      ->check(non_negative());
  add(app, "--checkpointing", o->checkpointing, "activation checkpointing (default: the config's)")
      ->type_name("none|full|every_k")
      ->check(CLI::IsMember({"none", "full", "every_k"}));
  add(app, "--checkpoint-every", o->checkpoint_every, "k of every_k (default: the config's)")
      ->type_name("K")
      ->check(positive());
  add(app, "--model", o->model, "a combined Hugging Face config dir instead of the config's model")->type_name("DIR");
  add(app, "--images", o->images, "images per sample (default: from the model and data config)")
      ->check(non_negative());
  add(app, "--max-pixels", o->max_pixels,
      "towers of variable patch grids (Qwen2.5-VL): pixels of each image or video frame (default 1003520 = "
      "28*28*1280, the image processor's)")
      ->type_name("N")
      ->check(positive());
  add(app, "--frames", o->frames, "towers of variable patch grids: frames per visual input (1: an image)")
      ->type_name("N")
      ->check(positive());
  add(app, "--mod-kept", o->mod_kept, "fraction of the tokens MoD layers keep (default: from the MoD config)")
      ->type_name("F")
      ->check(between(0.0, 1.0));
  add(app, "--set", o->sets, "override one config key; repeat for several")->type_name("KEY=VALUE");
  add(app, "--json", o->json, "also write the plan as JSON here (- for stdout)")->type_name("FILE|-");
  return [o] { return run_plan(*o); };
}

Register reg_plan({"plan",
                   "per-rank memory (weights, grads, optimizer, activations) and communication of a config",
                   setup_plan});

}  // namespace
}  // namespace gmod::cli

// `gmod plan CONFIG`: the per-rank memory and communication plan of a training config
// (trainer/memory_plan.h): bytes of weights, gradients, optimizer state, activations and transients at the
// step's peak, every phase's total, the bytes communicated per optimizer step, and whether it fits a per-GPU
// budget. Prints a table, and the same as JSON with --json FILE ("-" = stdout). Nothing is allocated: it runs
// on a laptop for a 13B model.
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "launch/args.h"
#include "model/config.h"
#include "trainer/memory_plan.h"
#include "trainer/model_setup.h"
#include "trainer/train_config.h"

namespace gmod::cli {
namespace {

using json = nlohmann::json;

// Keys the plan reads itself (other branches add them to TrainConfig); removed before TrainConfig parses the
// rest, so a config that already uses them plans on a build whose TrainConfig does not know them yet.
const std::vector<std::pair<std::string, std::string>> kPlanKeys = {{"model", "activation_checkpointing"},
                                                                    {"model", "checkpoint_every"}};

int run_plan(const std::vector<std::string>& argv) {
  Args a(argv);
  a.check_known({"world", "gpu-mem", "reserve-gb", "checkpointing", "checkpoint-every", "json", "set",
                 "model", "images", "mod-kept"});
  if (a.positional().size() != 1)
    throw std::invalid_argument(
        "usage: gmod plan CONFIG.json [--world N] [--gpu-mem GiB] [--reserve-gb GiB] "
        "[--checkpointing none|full|every_k] [--checkpoint-every K] [--model DIR] "
        "[--images N] [--mod-kept F] [--set key=value]... [--json FILE|-]");
  const std::string path = a.positional()[0];
  std::ifstream f(path);
  if (!f) throw std::runtime_error(path + ": cannot open the training config");
  json raw;
  try {
    raw = json::parse(f, nullptr, true, /*ignore_comments=*/true);
  } catch (const json::exception& e) {
    throw std::runtime_error(path + ": not valid JSON: " + e.what());
  }
  json rest = raw;
  for (const auto& [section, key] : kPlanKeys)
    if (rest.contains(section) && rest[section].is_object()) rest[section].erase(key);
  TrainConfig cfg = train_config_from_json(rest, a.all("set"), path);
  if (auto m = a.get("model")) {  // a combined HF-style config dir instead of the config's model
    cfg.model.path = *m;
    cfg.model.llm.clear(), cfg.model.vision.clear(), cfg.model.projector.clear();
  }
  if (cfg.model.path.empty() && cfg.model.llm.empty())
    throw std::invalid_argument(path + ": neither model.path nor model.llm is set (or pass --model DIR)");
  const LlavaConfig model = run_model_config(cfg.model);  // the combined dir's config, or the parts' composition
  const int world = std::stoi(a.get_or("world", "1"));
  if (world < 1) throw std::invalid_argument("--world must be >= 1");

  MemoryPlanInputs in = plan_inputs_from_config(cfg, raw, model, world);
  if (auto c = a.get("checkpointing")) in.checkpointing = *c;
  if (auto k = a.get("checkpoint-every")) in.checkpoint_every = std::stoi(*k);
  if (auto n = a.get("images")) in.images_per_sample = std::stoi(*n);
  if (auto k = a.get("mod-kept")) in.mod_kept_fraction = std::stod(*k);
  constexpr double GB = double(int64_t(1) << 30);  // GiB, as nvidia-smi reports "80 GB" cards
  if (auto g = a.get("gpu-mem")) {
    in.budget_bytes = std::stod(*g) * GB;
    // CUDA context, NCCL and cuBLAS workspaces, caching-allocator fragmentation: not derived, an allowance.
    in.reserve_bytes = std::stod(a.get_or("reserve-gb", "4")) * GB;
  } else if (auto r = a.get("reserve-gb")) {
    in.reserve_bytes = std::stod(*r) * GB;
  }
  const MemoryPlan p = plan_memory(in);

  std::cout << "plan: " << path << " (model " << describe_model_source(cfg.model) << "), world " << world << ", ZeRO-"
            << in.stage << ", " << in.dtype << ", micro-batch " << in.micro_batch << " x " << in.seq_len
            << " tokens"
            << (in.images_per_sample > 0 ? " (" + std::to_string(in.images_per_sample) + " image/sample)"
                                         : "")
            << ", checkpointing " << in.checkpointing
            << (in.checkpointing == "every_k" ? " k=" + std::to_string(in.checkpoint_every) : "")
            << (in.mod_layers.empty()
                    ? ", dense"
                    : ", " + std::to_string(in.mod_layers.size()) + " MoD layers keeping " +
                          std::to_string(in.mod_kept_fraction).substr(0, 5) + " of the tokens")
            << ", grad accumulation " << in.grad_accum << "\n\n"
            << format_plan(p);
  if (auto j = a.get("json")) {
    json out = to_json(p);
    out["inputs"] = {{"config", path},
                     {"model", describe_model_source(cfg.model)},
                     {"world", world},
                     {"zero_stage", in.stage},
                     {"dtype", in.dtype},
                     {"micro_batch", in.micro_batch},
                     {"seq_len", in.seq_len},
                     {"images_per_sample", in.images_per_sample},
                     {"checkpointing", in.checkpointing},
                     {"checkpoint_every", in.checkpoint_every},
                     {"mod_layers", in.mod_layers},
                     {"mod_kept_fraction", in.mod_kept_fraction},
                     {"accumulate_fp32", in.accumulate_fp32},
                     {"reduce_dtype", in.reduce_dtype},
                     {"grad_accum", in.grad_accum}};
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

Register reg({"plan",
              "per-rank memory (weights, grads, optimizer, activations) and communication of a config",
              run_plan});

}  // namespace
}  // namespace gmod::cli

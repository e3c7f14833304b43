// `gmod convert`: a dense Hugging Face model directory -> a γ-MoD one (mod/mod_checkpoint.h layout). The MoD
// layers come from a conversion rule (mod/conversion.h); rules on ARank read it from `gmod arank`'s JSON. The new
// routers are initialised as the MoD config says (router_init, router_init_seed); everything else is copied.
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "launch/args.h"
#include "model/pretrained.h"
#include "mod/conversion.h"
#include "mod/mod_checkpoint.h"

namespace gmod::cli {
namespace {

namespace fs = std::filesystem;

const char* kUsage =
    "usage: gmod convert --model DENSE_HF_DIR --out DIR --rule keep_top:4|threshold:T|layers:a,b|arank_mod\n"
    "                    [--arank arank.json] [--skip-frac 0.5] [--router gamma_shared|per_layer|attention]\n"
    "                    [--forced questions|questions_answers] [--router-init kaiming_uniform|xavier_uniform|zero]\n"
    "                    [--router-seed N] [--dtype fp32|bf16]\n";

// Per-layer ARank means from write_arank_json's file: {"layers": [{"layer": i, "mean": m, ...}, ...]}.
std::vector<double> read_arank(const std::string& path, int n_layers) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("--arank " + path + ": cannot open");
  std::vector<double> v(size_t(n_layers), 0.0);
  std::vector<bool> seen(size_t(n_layers), false);
  try {
    const auto j = nlohmann::json::parse(f);
    for (const auto& l : j.at("layers")) {
      const int i = l.at("layer").get<int>();
      if (i < 0 || i >= n_layers)
        throw std::runtime_error("--arank " + path + ": layer " + std::to_string(i) + " but the model has " +
                                 std::to_string(n_layers) + " layers");
      v[size_t(i)] = l.at("mean").get<double>();
      seen[size_t(i)] = true;
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("--arank " + path + ": not an ARank file of gmod arank (" + e.what() + ")");
  }
  for (int i = 0; i < n_layers; ++i)
    if (!seen[size_t(i)]) throw std::runtime_error("--arank " + path + ": no value for layer " + std::to_string(i));
  return v;
}

int run_convert(const std::vector<std::string>& argv) {
  Args a(argv);
  a.check_known({"model", "out", "rule", "arank", "skip-frac", "router", "forced", "router-init", "router-seed", "dtype"});
  const auto dir = a.get("model"), out = a.get("out"), rule_s = a.get("rule");
  if (!dir || !out || !rule_s) throw std::invalid_argument(std::string("--model, --out and --rule are required\n") + kUsage);
  if (read_mod_config(*dir)) throw std::invalid_argument(*dir + ": already a MoD model (its config.json has \"mod\")");
  const std::string dtype_s = a.get_or("dtype", "fp32");
  if (dtype_s != "fp32" && dtype_s != "bf16") throw std::invalid_argument("--dtype must be fp32 or bf16");

  nlohmann::json j = {{"router", a.get_or("router", "gamma_shared")},
                      {"forced_keep", a.get_or("forced", "questions_answers")},
                      {"skip_frac", std::stod(a.get_or("skip-frac", "0.5"))},
                      {"router_init", a.get_or("router-init", "kaiming_uniform")},
                      {"router_init_seed", std::stoull(a.get_or("router-seed", "0"))}};
  MoDConfig mc = mod_config_from_json(j, "gmod convert options");

  auto model = load_pretrained(*dir, at::kFloat, at::kCPU);
  const int n = model->config.text.num_hidden_layers;
  const ConversionRule rule = parse_conversion_rule(*rule_s);
  std::vector<double> arank;
  if (rule.kind == ConversionRule::Kind::kThreshold || rule.kind == ConversionRule::Kind::kKeepTop) {
    const auto path = a.get("arank");
    if (!path)
      throw std::invalid_argument("--rule " + *rule_s +
                                  " selects layers by ARank: compute it with `gmod arank --model " + *dir +
                                  " --data DATA.json --out arank.json` and pass --arank arank.json "
                                  "(or use --rule layers:a,b or arank_mod, which need none)");
    arank = read_arank(*path, n);
  }
  mc.mod_layers = select_mod_layers(rule, n, arank);
  mc.selection = rule.to_string();
  if (mc.mod_layers.empty())
    throw std::invalid_argument("--rule " + *rule_s + " selects no MoD layer in this " + std::to_string(n) +
                                "-layer model");
  validate(mc, n, "gmod convert");
  convert_to_mod(*model, mc);
  model->to(at::kCPU, dtype_s == "bf16" ? at::kBFloat16 : at::kFloat);
  save_mod_pretrained(*model, mc, *out);
  for (const char* f : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                        "preprocessor_config.json", "processor_config.json", "chat_template.json",
                        "generation_config.json"}) {
    const fs::path src = fs::path(*dir) / f;
    if (fs::exists(src)) fs::copy_file(src, fs::path(*out) / f, fs::copy_options::overwrite_existing);
  }
  std::string layers;
  for (int l : mc.mod_layers) layers += (layers.empty() ? "" : ",") + std::to_string(l);
  std::cout << "wrote " << *out << ": " << n << " layers, MoD layers [" << layers << "] (" << mc.selection
            << "), router " << to_string(mc.router) << ", skip_frac " << mc.skip_frac << ", forced "
            << to_string(mc.forced_keep) << "\n";
  return 0;
}

Register reg({"convert", "a dense Hugging Face model dir -> a γ-MoD one (rule, router, capacity)", run_convert});

}  // namespace
}  // namespace gmod::cli

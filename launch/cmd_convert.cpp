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
#include "mod/fastv.h"
#include "mod/mod_checkpoint.h"

namespace gmod::cli {
namespace {

namespace fs = std::filesystem;

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

struct ConvertOptions {
  std::string model, out, rule, arank;
  double skip_frac = 0.5;
  std::string router = "gamma_shared";
  std::string forced = "questions_answers";
  std::string router_init = "kaiming_uniform";
  uint64_t router_seed = 0;
  std::string dtype = "fp32";
  bool direct = false;            // Direct γ-MoD: the attention rule instead of a trained router
  std::string adaptive = "none";  // adaptive inference thresholds (mod/routing_rule.h)
  double avg_seqlen = 0.0;
};

int run_convert(const ConvertOptions& o) {
  nlohmann::json j = {{"router", o.router},
                      {"forced_keep", o.forced},
                      {"skip_frac", o.skip_frac},
                      {"router_init", o.router_init},
                      {"router_init_seed", o.router_seed},
                      {"adaptive_threshold", o.adaptive},
                      {"avg_seqlen", o.avg_seqlen}};
  // Direct γ-MoD (rebuttal to reviewer 6GUt): no trained router; the γ-MoD routable tokens (image ∪ system) that
  // receive the least attention in the previous layer are skipped (A-MoD scores, carried across consecutive MoD
  // layers), skip_frac of them, in the layers the rule picks.
  if (o.direct) {
    if (o.router != "gamma_shared") throw UsageError("--direct sets the router itself; drop --router " + o.router);
    j["router"] = "attention";
    j["amod_routable"] = "roles";
    j["amod_skipped"] = "carry";
  }
  // FastV (mod/fastv.h): --rule fastv:K:R, every layer from K on, no router.
  const bool fastv = o.rule.rfind("fastv:", 0) == 0;
  if (fastv && (o.direct || o.adaptive != "none"))
    throw UsageError("--rule " + o.rule + ": FastV has no router, so no --direct or --adaptive-threshold");
  MoDConfig mc;
  ConversionRule rule;
  try {  // only the options feed these: their errors are usage errors
    mc = mod_config_from_json(j, "gmod convert options");
    if (!fastv) rule = parse_conversion_rule(o.rule);
  } catch (const std::exception& e) {
    throw UsageError(e.what());
  }
  if (read_mod_config(o.model)) throw UsageError(o.model + ": already a MoD model (its config.json has \"mod\")");

  const bool by_arank =
      !fastv && (rule.kind == ConversionRule::Kind::kThreshold || rule.kind == ConversionRule::Kind::kKeepTop);
  if (by_arank && o.arank.empty())
    throw UsageError("--rule " + o.rule + " selects layers by ARank: compute it with `gmod arank --model " + o.model +
                     " --data DATA.json --out arank.json` and pass --arank arank.json "
                     "(or use --rule layers:a,b or arank_mod, which need none)");
  MoDConfig fastv_mc;
  if (fastv) {  // checked before the weights are read
    try {
      fastv_mc = parse_fastv(o.rule.substr(6), load_model_config(o.model).text.num_hidden_layers);
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--rule ") + e.what());
    }
  }
  auto model = load_pretrained(o.model, at::kFloat, at::kCPU);
  check_finite_weights(*model, o.model, "converted");  // before ARank files and conversion: name the source
  const int n = model->config.text.num_hidden_layers;
  std::vector<double> arank;
  if (by_arank || !o.arank.empty()) arank = read_arank(o.arank, n);
  if (fastv) {
    mc = fastv_mc;
  } else {
    mc.mod_layers = select_mod_layers(rule, n, arank);
    mc.selection = rule.to_string() + (o.direct ? " (direct)" : "");
  }
  // The MoD layers' ARank goes with the model (adaptive "arank" thresholds read it).
  if (!arank.empty())
    for (int l : mc.mod_layers) mc.layer_arank.push_back(arank[size_t(l)]);
  if (mc.adaptive_threshold == AdaptiveThreshold::kARank && arank.empty())
    throw UsageError("--adaptive-threshold arank needs the layers' ARank: pass --arank arank.json");
  if (mc.mod_layers.empty())
    throw std::invalid_argument("--rule " + o.rule + " selects no MoD layer in this " + std::to_string(n) +
                                "-layer model");
  validate(mc, n, "gmod convert");
  convert_to_mod(*model, mc);
  model->to(at::kCPU, o.dtype == "bf16" ? at::kBFloat16 : at::kFloat);
  save_mod_pretrained(*model, mc, o.out);
  for (const char* f : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                        "preprocessor_config.json", "processor_config.json", "chat_template.json",
                        "generation_config.json"}) {
    const fs::path src = fs::path(o.model) / f;
    if (fs::exists(src)) fs::copy_file(src, fs::path(o.out) / f, fs::copy_options::overwrite_existing);
  }
  std::string layers;
  for (int l : mc.mod_layers) layers += (layers.empty() ? "" : ",") + std::to_string(l);
  std::cout << "wrote " << o.out << ": " << n << " layers, MoD layers [" << layers << "] (" << mc.selection
            << "), router " << to_string(mc.router) << ", skip_frac " << mc.skip_frac << ", forced "
            << to_string(mc.forced_keep) << "\n";
  return 0;
}

Runner setup(CLI::App& app) {
  auto o = std::make_shared<ConvertOptions>();
  add(app, "--model", o->model, "dense Hugging Face model dir")->type_name("DIR")->required();
  add(app, "--out", o->out, "the γ-MoD model dir to write")->type_name("DIR")->required();
  add(app, "--rule", o->rule,
      "which layers become MoD: keep_top:N (all but the N highest-ARank layers), threshold:T (ARank < T), "
      "layers:a,b, arank_mod, or fastv:K:R (FastV: from layer K on drop the fraction R of the image tokens)")
      ->type_name("RULE")
      ->required();
  add(app, "--arank", o->arank, "per-layer ARank of `gmod arank --out` (for keep_top and threshold)")
      ->type_name("JSON");
  add(app, "--skip-frac", o->skip_frac, "fraction of the routable tokens each MoD layer skips in training")
      ->check(between(0.0, 1.0));
  add(app, "--router", o->router, "router: gamma_shared, per_layer or attention");
  add(app, "--forced", o->forced, "tokens always kept: questions or questions_answers");
  add(app, "--router-init", o->router_init, "router weights: kaiming_uniform, xavier_uniform or zero");
  add(app, "--router-seed", o->router_seed, "seed of the router initialisation");
  add(app, "--dtype", o->dtype, "dtype of the written weights")->check(CLI::IsMember({"fp32", "bf16"}));
  add_flag(app, "--direct", o->direct,
      "Direct γ-MoD: no trained router, skip the routable tokens that get the least attention in the previous "
      "layer (router attention, amod_routable roles, amod_skipped carry)");
  add(app, "--adaptive-threshold", o->adaptive,
      "inference thresholds: none, seqlen (δ_s·(1+ln(seqlen/avg_seqlen)), needs --avg-seqlen) or arank "
      "(δ_s·(1+ln(ARank_l/mean)), needs --arank)")
      ->check(CLI::IsMember({"none", "seqlen", "arank"}));
  add(app, "--avg-seqlen", o->avg_seqlen, "mean token count of the tuning data (adaptive seqlen thresholds)")
      ->check(positive());
  return [o] { return run_convert(*o); };
}

Register reg({"convert", "a dense Hugging Face model dir -> a γ-MoD one (rule, router, capacity)", setup});

}  // namespace
}  // namespace gmod::cli

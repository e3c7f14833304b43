// `gmod convert`: a dense Hugging Face model directory -> a γ-MoD one (mod/mod_checkpoint.h layout). The MoD
// layers come from a conversion rule (mod/conversion.h), or from a method's own rule (TokenSelector::owns_rule: its
// rule decides the layers and what they keep); rules on ARank read it from `gmod arank`'s JSON. The new routers are
// initialised as the MoD config says (router_init, router_init_seed); everything else is copied.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "data/arank_samples.h"
#include "launch/args.h"
#include "launch/cli_hf_files.h"
#include "launch/cli_model.h"
#include "model/pretrained.h"
#include "mod/conversion.h"
#include "mod/method_registry.h"
#include "mod/mod_checkpoint.h"
#include "mod/token_selection.h"

namespace gmod::cli {
namespace {

namespace fs = std::filesystem;

// The file `gmod arank --out` writes: {"layers": [{"layer": i, "mean": m, ...}, ...], "seqlen": {"mean",
// "samples", "of", "data"}} (seqlen: the sampled records' mean token count; older files have none).
struct ARankFile {
  std::vector<double> layers;  // per-layer ARank means
  double seqlen_mean = 0.0;    // 0: not in the file
  std::string seqlen_source;
};

ARankFile read_arank(const std::string& path, int n_layers) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("--arank " + path + ": cannot open");
  ARankFile a;
  a.layers.assign(size_t(n_layers), 0.0);
  std::vector<bool> seen(size_t(n_layers), false);
  try {
    const auto j = nlohmann::json::parse(f);
    for (const auto& l : j.at("layers")) {
      const int i = l.at("layer").get<int>();
      if (i < 0 || i >= n_layers)
        throw std::runtime_error("--arank " + path + ": layer " + std::to_string(i) + " but the model has " +
                                 std::to_string(n_layers) + " layers");
      a.layers[size_t(i)] = l.at("mean").get<double>();
      seen[size_t(i)] = true;
    }
    if (j.contains("seqlen")) {
      const auto& s = j.at("seqlen");
      a.seqlen_mean = s.at("mean").get<double>();
      if (!(a.seqlen_mean > 0.0))
        throw std::runtime_error("--arank " + path + ": seqlen mean " + std::to_string(a.seqlen_mean) +
                                 " is not > 0");
      a.seqlen_source = "mean tokens per sample of " + std::to_string(s.at("samples").get<int64_t>()) + " " +
                        s.at("of").get<std::string>() + " of " + s.at("data").get<std::string>() +
                        ", measured by gmod arank (" + path + ")";
    }
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error("--arank " + path + ": not an ARank file of gmod arank (" + e.what() + ")");
  }
  for (int i = 0; i < n_layers; ++i)
    if (!seen[size_t(i)]) throw std::runtime_error("--arank " + path + ": no value for layer " + std::to_string(i));
  return a;
}

struct ConvertOptions {
  std::string model, out, rule, arank;
  double skip_frac = 0.5;
  std::string router = default_method_name();
  std::string forced = "questions_answers";
  std::string router_init = "kaiming_uniform";
  uint64_t router_seed = 0;
  std::string dtype = "fp32";
  bool direct = false;            // the convert flag of a method (flag_method(): --direct, Direct γ-MoD)
  std::string adaptive = "none";  // adaptive inference thresholds (mod/routing_rule.h)
  double avg_seqlen = 0.0;        // 0: measured (--avg-seqlen-data, else the --arank file's "seqlen")
  DataOptions avg_data;           // --avg-seqlen-data / --avg-seqlen-images
  int64_t avg_samples = 50;
  TextOptions text;  // how --avg-seqlen-data's records become tokens
};

// avg_seqlen measured as gmod arank samples (data/arank_samples.h): the first `avg_samples` image records of
// the file, each cut to its first prompt (system + first question up to the assistant turn, image tokens
// included), the token count the adaptive rule sees at prefill. A record that cannot be read is an error
// naming it: a mean over the records that happened to parse would not be the data's.
SeqLenMean measure_avg_seqlen(const ConvertOptions& o, const std::shared_ptr<MultimodalLM>& model,
                              std::string& source) {
  CliModel m;
  m.model = model;
  m.dir = o.model;
  auto ds = make_cli_dataset(o.avg_data, o.text, m, load_cli_tokenizer(o.text, m));
  ARankSampling sampling;
  sampling.samples = o.avg_samples;
  std::vector<size_t> order(ds->size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  ARankSamplingStats stats;
  const auto batches = arank_batches(*ds, order, sampling, stats);
  if (stats.bad > 0)
    throw std::runtime_error("--avg-seqlen-data " + o.avg_data.data + ": " + std::to_string(stats.bad) +
                             " record(s) cannot be read; first: " + stats.first_bad);
  const SeqLenMean r = mean_seqlen(batches);
  source = "mean tokens per sample of " + std::to_string(r.samples) + " first prompts of " + o.avg_data.data +
           ", measured by gmod convert (" + stats.summary() + ")";
  return r;
}

// The method with a convert flag (TokenSelector::convert_flag: --direct), if one has.
const TokenSelector* flag_method() {
  for (const TokenSelector* m : registered_methods())
    if (m->convert_flag().flag) return m;
  return nullptr;
}

// "a, b or c".
std::string either(const std::vector<std::string>& items, const std::string& last_sep) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) s += (i == 0 ? "" : i + 1 == items.size() ? last_sep : ", ") + items[i];
  return s;
}

int run_convert(const ConvertOptions& o) {
  nlohmann::json j = {{"router", o.router},
                      {"forced_keep", o.forced},
                      {"skip_frac", o.skip_frac},
                      {"router_init", o.router_init},
                      {"router_init_seed", o.router_seed},
                      {"adaptive_threshold", o.adaptive},
                      {"avg_seqlen", o.avg_seqlen}};
  // A method's convert flag (--direct: Direct γ-MoD) selects it with the settings it fixes, instead of --router.
  const TokenSelector* flagged = o.direct ? flag_method() : nullptr;
  if (flagged) {
    if (o.router != default_method_name())
      throw UsageError(std::string(flagged->convert_flag().flag) + " sets the router itself; drop --router " + o.router);
    flagged->convert_flag_keys(j);
  }
  // A method's own rule (FastV, p-MoD, PyramidDrop): the rule decides the layers and what they keep; the method
  // refuses the options that do not go with it.
  ConvertChoices given;
  given.flag = o.direct;
  given.adaptive = o.adaptive != "none";
  given.router = o.router;
  given.skip_frac_given = o.skip_frac != ConvertOptions{}.skip_frac;
  given.forced_given = o.forced != ConvertOptions{}.forced;
  given.router_init = o.router_init;
  given.router_init_given = o.router_init != ConvertOptions{}.router_init;
  given.router_seed = o.router_seed;
  const TokenSelector* rule_method = method_for_rule(o.rule);
  if (rule_method) {
    try {
      rule_method->check_convert_options(o.rule, given);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
  }
  const bool by_seqlen = o.adaptive == "seqlen";
  if (!by_seqlen && (o.avg_seqlen > 0.0 || !o.avg_data.data.empty()))
    throw UsageError("--avg-seqlen and --avg-seqlen-data are for --adaptive-threshold seqlen");
  if (o.avg_seqlen > 0.0 && !o.avg_data.data.empty())
    throw UsageError("--avg-seqlen " + std::to_string(o.avg_seqlen) +
                     " excludes --avg-seqlen-data (which measures it)");
  if (by_seqlen && !(o.avg_seqlen > 0.0) && o.avg_data.data.empty() && o.arank.empty())
    throw UsageError("--adaptive-threshold seqlen needs avg_seqlen, the mean token count of the data: pass "
                     "--avg-seqlen-data DATA.json (measured here), an --arank file of gmod arank (it records "
                     "the mean of its samples) or --avg-seqlen N");
  MoDConfig mc;
  ConversionRule rule;
  try {  // only the options feed these: their errors are usage errors
    mc = mod_config_from_json(j, "gmod convert options");
    if (!rule_method) rule = parse_conversion_rule(o.rule);
  } catch (const std::exception& e) {
    throw UsageError(e.what());
  }
  if (read_mod_config(o.model)) throw UsageError(o.model + ": already a MoD model (its config.json has \"mod\")");

  const bool by_arank =
      !rule_method && (rule.kind == ConversionRule::Kind::kThreshold || rule.kind == ConversionRule::Kind::kKeepTop);
  if (by_arank && o.arank.empty())
    throw UsageError("--rule " + o.rule + " selects layers by ARank: compute it with `gmod arank --model " + o.model +
                     " --data DATA.json --out arank.json` and pass --arank arank.json "
                     "(or use --rule layers:a,b or arank_mod, which need none)");
  MoDConfig rule_mc;
  const bool rule_early = rule_method && rule_method->rule_checked_before_weights();
  if (rule_early) {  // checked before the weights are read
    try {
      rule_mc = rule_method->rule_config(o.rule, load_model_config(o.model).text.num_hidden_layers, given);
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--rule ") + e.what());
    }
  }
  auto model = load_pretrained(o.model, at::kFloat, at::kCPU);
  check_finite_weights(*model, o.model, "converted");  // before ARank files and conversion: name the source
  const int n = model->config.text.num_hidden_layers;
  std::vector<double> arank;
  ARankFile arank_file;
  if (by_arank || !o.arank.empty()) arank = (arank_file = read_arank(o.arank, n)).layers;
  if (by_seqlen) {  // avg_seqlen: given, else measured on --avg-seqlen-data, else the ARank samples' mean
    if (o.avg_seqlen > 0.0) {
      mc.avg_seqlen_source = "given (--avg-seqlen)";
    } else if (!o.avg_data.data.empty()) {
      mc.avg_seqlen = measure_avg_seqlen(o, model, mc.avg_seqlen_source).mean;
    } else if (arank_file.seqlen_mean > 0.0) {
      mc.avg_seqlen = arank_file.seqlen_mean;
      mc.avg_seqlen_source = arank_file.seqlen_source;
    } else {
      throw std::runtime_error("--arank " + o.arank +
                               ": no \"seqlen\" (written by an older gmod arank); run gmod arank again, or "
                               "pass --avg-seqlen-data DATA.json or --avg-seqlen N");
    }
  }
  if (rule_early) {
    mc = rule_mc;
  } else if (rule_method) {
    mc = rule_method->rule_config(o.rule, n, given);
  } else {
    mc.mod_layers = select_mod_layers(rule, n, arank);
    mc.selection = rule.to_string();
    if (flagged) mc.selection += " (" + std::string(flagged->convert_flag().flag).substr(2) + ")";  // "(direct)"
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
  // The source's tokenizer and processor files; its chat template stays unless --template names one.
  write_hf_side_files(*model, {o.model}, o.out, o.text.template_name, /*keep_source_template=*/o.text.template_name == "auto");
  std::string layers;
  for (int l : mc.mod_layers) layers += (layers.empty() ? "" : ",") + std::to_string(l);
  std::cout << "wrote " << o.out << ": " << n << " layers, MoD layers [" << layers << "] (" << mc.selection
            << "), router " << to_string(mc.router);
  // A method's rule that keeps a share of the image tokens per layer (p-MoD, PyramidDrop): those shares.
  if (rule_method && rule_method->image_keep_ratio(mc, mc.mod_layers.front(), n)) {
    std::cout << ", image tokens kept:";
    for (int l : mc.mod_layers) std::printf(" %d %.3f", l, *rule_method->image_keep_ratio(mc, l, n));
    std::cout << "\n";
  } else {
    std::cout << ", skip_frac " << mc.skip_frac << ", forced " << to_string(mc.forced_keep) << "\n";
  }
  if (by_seqlen) std::cout << "avg_seqlen " << mc.avg_seqlen << ": " << mc.avg_seqlen_source << "\n";
  return 0;
}

Runner setup_convert(CLI::App& app) {
  auto o = std::make_shared<ConvertOptions>();
  add(app, "--model", o->model, "dense Hugging Face model dir")->type_name("DIR")->required();
  add(app, "--out", o->out, "the γ-MoD model dir to write")->type_name("DIR")->required();
  // The layer rules, then the methods' own rules (by name); --router picks among the methods without one.
  std::vector<std::string> rules = {"keep_top:N (all but the N highest-ARank layers)", "threshold:T (ARank < T)",
                                    "layers:a,b", "arank_mod"};
  std::vector<std::string> routers;
  const std::vector<const TokenSelector*> methods = registered_methods();
  std::vector<const TokenSelector*> by_name = methods;
  std::sort(by_name.begin(), by_name.end(), [](auto* a, auto* b) { return std::string(a->name()) < b->name(); });
  for (const TokenSelector* m : by_name)
    if (!m->rule_help().empty()) rules.push_back(m->rule_help());
  for (const TokenSelector* m : methods)
    if (m->rule_help().empty()) routers.push_back(m->name());
  add(app, "--rule", o->rule, "which layers become MoD: " + either(rules, ", or "))
      ->type_name("RULE")
      ->required();
  add(app, "--arank", o->arank, "per-layer ARank of `gmod arank --out` (for keep_top and threshold)")
      ->type_name("JSON");
  add(app, "--skip-frac", o->skip_frac, "fraction of the routable tokens each MoD layer skips in training")
      ->check(between(0.0, 1.0));
  add(app, "--router", o->router, "router: " + either(routers, " or "));
  add(app, "--forced", o->forced, "tokens always kept: questions or questions_answers");
  add(app, "--router-init", o->router_init, "router weights: kaiming_uniform, xavier_uniform or zero");
  add(app, "--router-seed", o->router_seed, "seed of the router initialisation");
  add(app, "--dtype", o->dtype, "dtype of the written weights")->check(CLI::IsMember({"fp32", "bf16"}));
  if (const TokenSelector* m = flag_method()) add_flag(app, m->convert_flag().flag, o->direct, m->convert_flag().help);
  add(app, "--adaptive-threshold", o->adaptive,
      "inference thresholds: none, seqlen (δ_s·(1+ln(seqlen/avg_seqlen)), avg_seqlen from --avg-seqlen, "
      "--avg-seqlen-data or --arank) or arank "
      "(δ_s·(1+ln(ARank_l/mean)), needs --arank)")
      ->check(CLI::IsMember({"none", "seqlen", "arank"}));
  add(app, "--avg-seqlen", o->avg_seqlen,
      "avg_seqlen of adaptive seqlen thresholds, given (default: measured on --avg-seqlen-data, else the "
      "mean token count the --arank file records)")
      ->check(positive());
  add(app, "--avg-seqlen-data", o->avg_data.data,
      "measure avg_seqlen on these LLaVA-format records: the mean token count of the first prompts (system + "
      "first question, image tokens included) of the first --avg-seqlen-samples image records, as gmod arank "
      "samples them")
      ->type_name("JSON");
  add(app, "--avg-seqlen-images", o->avg_data.images,
      "image folder of --avg-seqlen-data (default: its folder)")
      ->type_name("DIR");
  add(app, "--avg-seqlen-samples", o->avg_samples, "image records --avg-seqlen-data averages over")
      ->check(positive());
  add_text_options(app, o->text);
  return [o] { return run_convert(*o); };
}

Register reg_convert({"convert", "a dense Hugging Face model dir -> a γ-MoD one (rule, router, capacity)",
                      setup_convert});

}  // namespace
}  // namespace gmod::cli

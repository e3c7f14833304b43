#include "trainer/config/train_config.h"

#include "data/conversation.h"
#include "mod/conversion.h"
#include "model/activation_checkpoint.h"
#include "model/config.h"
#include "trainer/config/config_json.h"
#include "trainer/config/param_groups.h"
#include "trainer/model_setup.h"
#include "trainer/step_profiler.h"

#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>
#include <type_traits>

namespace gmod {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace config_json;

// The int64_t fields; every other signed integer field is an int (check_ranges holds them to 32 bits).
const std::set<std::string> kInt64Keys = {"data.preflight_records", "data.max_image_pixels"};

template <typename T>
void get(const json& j, const char* key, T& out) {
  out = j.at(key).get<T>();
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {  // never a silent wrap (a missing kInt64Keys entry)
    const json& v = j.at(key);
    if (v.is_number_unsigned() ? uint64_t(out) != v.get<uint64_t>() || (std::is_signed_v<T> && out < 0)
                               : int64_t(out) != v.get<int64_t>())
      throw std::invalid_argument(std::string(key) + ": " + v.dump() + " does not fit its field");
  }
}

json groups_json(const std::vector<ParamGroupConfig>& groups) {
  json a = json::array();
  for (const auto& g : groups) a.push_back(to_json(g));
  return a;
}

}  // namespace

json to_json(const TrainConfig& c) {
  json mod_cfg = to_json(c.mod.config);
  mod_cfg.erase("mod_enable");  // `mod.enabled` is the switch
  return json{
      {"model",
       {{"path", c.model.path}, {"llm", c.model.llm}, {"vision", c.model.vision}, {"projector", c.model.projector},
        {"vision_feature_layer", c.model.vision_feature_layer},
        {"vision_feature_select_strategy", c.model.vision_feature_select_strategy},
        {"vision_slow", c.model.vision_slow}, {"input_image_size", c.model.input_image_size},
        {"freeze_vision", c.model.freeze_vision}, {"vision_aux", c.model.vision_aux},
        {"image_size_aux", c.model.image_size_aux}, {"image_grid", c.model.image_grid},
        {"image_global", c.model.image_global}, {"optimize_vision_tower", c.model.optimize_vision_tower},
        {"optimize_vision_tower_aux", c.model.optimize_vision_tower_aux},
        {"image_grid_pinpoints", c.model.image_grid_pinpoints}, {"dtype", c.model.dtype},
        {"device", c.model.device}, {"init", c.model.init},
        {"init_seed", c.model.init_seed}, {"activation_checkpointing", c.model.activation_checkpointing}}},
      {"data",
       {{"train", c.data.train}, {"image_folder", c.data.image_folder}, {"tokenizer", c.data.tokenizer},
        {"template", c.data.template_name}, {"max_len", c.data.max_len}, {"truncation", c.data.truncation}, {"pack_to", c.data.pack_to},
        {"workers", c.data.workers}, {"prefetch", c.data.prefetch}, {"max_bad_fraction", c.data.max_bad_fraction},
        {"preflight_records", c.data.preflight_records}, {"max_image_pixels", c.data.max_image_pixels},
        {"group_by_modality_length", c.data.group_by_modality_length}, {"demo_records", c.data.demo_records}}},
      {"eval",
       {{"data", c.eval.data}, {"image_folder", c.eval.image_folder}, {"every", c.eval.every},
        {"max_batches", c.eval.max_batches}, {"exact_match", c.eval.exact_match}}},
      {"optimizer",
       {{"lr", c.optimizer.lr}, {"beta1", c.optimizer.beta1}, {"beta2", c.optimizer.beta2}, {"eps", c.optimizer.eps},
        {"weight_decay", c.optimizer.weight_decay}, {"warmup_ratio", c.optimizer.warmup_ratio},
        {"warmup_steps", c.optimizer.warmup_steps}, {"min_lr", c.optimizer.min_lr},
        {"max_grad_norm", c.optimizer.max_grad_norm}, {"zero_stage", c.optimizer.zero_stage},
        {"zero3_prefetch", c.optimizer.zero3_prefetch}, {"bucket_mb", c.optimizer.bucket_mb}, {"no_decay", c.optimizer.no_decay},
        {"reduce_dtype", c.optimizer.reduce_dtype}, {"overlap_comm", c.optimizer.overlap_comm},
        {"accumulate_fp32", c.optimizer.accumulate_fp32}, {"offload", c.optimizer.offload},
        {"groups", groups_json(c.optimizer.groups)}, {"mm_projector_lr", c.optimizer.mm_projector_lr},
        {"mm_vision_tower_lr", c.optimizer.mm_vision_tower_lr},
        {"zero3_reshard_after_forward", c.optimizer.zero3_reshard_after_forward}}},
      {"batch",
       {{"micro_batch", c.batch.micro_batch}, {"grad_accum", c.batch.grad_accum},
        {"global_batch", c.batch.global_batch}}},
      {"schedule",
       {{"epochs", c.schedule.epochs}, {"max_steps", c.schedule.max_steps},
        {"exit_at_step", c.schedule.exit_at_step}}},
      {"freeze",
       {{"vision", c.freeze.vision}, {"projector", c.freeze.projector}, {"llm", c.freeze.llm},
        {"llm_layers", c.freeze.llm_layers}}},
      {"mod",
       {{"enabled", c.mod.enabled}, {"rule", c.mod.rule}, {"arank_samples", c.mod.arank_samples},
        {"arank_protocol", c.mod.arank_protocol},
        {"config", mod_cfg}}},
      {"checkpoint",
       {{"every", c.checkpoint.every}, {"keep_last", c.checkpoint.keep_last}, {"async", c.checkpoint.async}}},
      {"metrics",
       {{"log_every", c.metrics.log_every}, {"peak_tflops", c.metrics.peak_tflops},
        {"log_sample_ids", c.metrics.log_sample_ids}, {"tensorboard", c.metrics.tensorboard},
        {"profile_steps", c.metrics.profile_steps}}},
      {"parallel",
       {{"timeout_s", c.parallel.timeout_s}, {"arank_timeout_s", c.parallel.arank_timeout_s},
        {"resume_check_timeout_s", c.parallel.resume_check_timeout_s},
        {"save_timeout_s", c.parallel.save_timeout_s}}},
      {"seed", c.seed},
      {"deterministic", c.deterministic},
      {"run_dir", c.run_dir},
      {"resume", c.resume},
      {"resume_allow_changes", c.resume_allow_changes},
      {"max_consecutive_skipped", c.max_consecutive_skipped},
      {"lora", to_json(c.lora)},
  };
}

TrainConfig train_config_from_json(const json& user, const std::vector<std::string>& overrides,
                                   const std::string& source, std::vector<std::string>* problems) {
  std::vector<std::string> errs;
  json j = to_json(TrainConfig{});
  merge_checked(j, user, "", errs);
  std::set<std::string> overridden;
  for (const auto& ov : overrides) apply_override(j, ov, errs, overridden);
  check_ranges(to_json(TrainConfig{}), j, "", overridden, kInt64Keys, errs);

  TrainConfig c;
  if (errs.empty() || problems) {  // bad values are at their defaults by now
    try {
      const json &m = j["model"], &d = j["data"], &e = j["eval"], &o = j["optimizer"], &b = j["batch"],
                 &s = j["schedule"], &f = j["freeze"], &md = j["mod"], &ck = j["checkpoint"], &mt = j["metrics"];
      get(m, "path", c.model.path), get(m, "dtype", c.model.dtype), get(m, "device", c.model.device);
      get(m, "init", c.model.init), get(m, "init_seed", c.model.init_seed);
      get(m, "llm", c.model.llm), get(m, "vision", c.model.vision), get(m, "projector", c.model.projector);
      get(m, "vision_feature_layer", c.model.vision_feature_layer);
      get(m, "vision_feature_select_strategy", c.model.vision_feature_select_strategy);
      get(m, "vision_slow", c.model.vision_slow), get(m, "input_image_size", c.model.input_image_size);
      get(m, "freeze_vision", c.model.freeze_vision);
      get(m, "vision_aux", c.model.vision_aux), get(m, "image_size_aux", c.model.image_size_aux);
      get(m, "image_grid", c.model.image_grid), get(m, "image_global", c.model.image_global);
      get(m, "optimize_vision_tower", c.model.optimize_vision_tower);
      get(m, "optimize_vision_tower_aux", c.model.optimize_vision_tower_aux);
      get(m, "image_grid_pinpoints", c.model.image_grid_pinpoints);
      get(m, "activation_checkpointing", c.model.activation_checkpointing);
      get(d, "train", c.data.train), get(d, "image_folder", c.data.image_folder);
      get(d, "tokenizer", c.data.tokenizer), get(d, "template", c.data.template_name);
      get(d, "max_len", c.data.max_len), get(d, "truncation", c.data.truncation), get(d, "workers", c.data.workers);
      get(d, "prefetch", c.data.prefetch), get(d, "max_bad_fraction", c.data.max_bad_fraction);
      get(d, "preflight_records", c.data.preflight_records), get(d, "max_image_pixels", c.data.max_image_pixels);
      get(d, "group_by_modality_length", c.data.group_by_modality_length);
      get(d, "demo_records", c.data.demo_records), get(d, "pack_to", c.data.pack_to);
      get(e, "data", c.eval.data), get(e, "image_folder", c.eval.image_folder), get(e, "every", c.eval.every);
      get(e, "max_batches", c.eval.max_batches), get(e, "exact_match", c.eval.exact_match);
      get(o, "lr", c.optimizer.lr), get(o, "beta1", c.optimizer.beta1), get(o, "beta2", c.optimizer.beta2);
      get(o, "eps", c.optimizer.eps), get(o, "weight_decay", c.optimizer.weight_decay);
      get(o, "warmup_ratio", c.optimizer.warmup_ratio), get(o, "warmup_steps", c.optimizer.warmup_steps);
      get(o, "min_lr", c.optimizer.min_lr), get(o, "max_grad_norm", c.optimizer.max_grad_norm);
      get(o, "zero_stage", c.optimizer.zero_stage), get(o, "bucket_mb", c.optimizer.bucket_mb);
      get(o, "zero3_prefetch", c.optimizer.zero3_prefetch);
      get(o, "no_decay", c.optimizer.no_decay), get(o, "reduce_dtype", c.optimizer.reduce_dtype);
      get(o, "overlap_comm", c.optimizer.overlap_comm), get(o, "accumulate_fp32", c.optimizer.accumulate_fp32);
      get(o, "offload", c.optimizer.offload);
      get(o, "mm_projector_lr", c.optimizer.mm_projector_lr);
      get(o, "mm_vision_tower_lr", c.optimizer.mm_vision_tower_lr);
      c.optimizer.groups = param_groups_from_json(o["groups"], "optimizer.groups", errs);
      get(o, "zero3_reshard_after_forward", c.optimizer.zero3_reshard_after_forward);
      get(b, "micro_batch", c.batch.micro_batch), get(b, "grad_accum", c.batch.grad_accum);
      get(b, "global_batch", c.batch.global_batch);
      get(s, "epochs", c.schedule.epochs), get(s, "max_steps", c.schedule.max_steps);
      get(s, "exit_at_step", c.schedule.exit_at_step);
      get(f, "vision", c.freeze.vision), get(f, "projector", c.freeze.projector), get(f, "llm", c.freeze.llm);
      get(f, "llm_layers", c.freeze.llm_layers);
      get(md, "enabled", c.mod.enabled), get(md, "rule", c.mod.rule), get(md, "arank_samples", c.mod.arank_samples);
      get(md, "arank_protocol", c.mod.arank_protocol);
      get(ck, "every", c.checkpoint.every), get(ck, "keep_last", c.checkpoint.keep_last);
      get(ck, "async", c.checkpoint.async);
      get(mt, "log_every", c.metrics.log_every), get(mt, "peak_tflops", c.metrics.peak_tflops);
      get(mt, "log_sample_ids", c.metrics.log_sample_ids);
      get(mt, "tensorboard", c.metrics.tensorboard);
      get(mt, "profile_steps", c.metrics.profile_steps);
      get(j["parallel"], "timeout_s", c.parallel.timeout_s);
      get(j["parallel"], "arank_timeout_s", c.parallel.arank_timeout_s);
      get(j["parallel"], "resume_check_timeout_s", c.parallel.resume_check_timeout_s);
      get(j["parallel"], "save_timeout_s", c.parallel.save_timeout_s);
      get(j, "seed", c.seed), get(j, "deterministic", c.deterministic), get(j, "run_dir", c.run_dir);
      get(j, "resume", c.resume), get(j, "max_consecutive_skipped", c.max_consecutive_skipped);
      get(j, "resume_allow_changes", c.resume_allow_changes);
      get(j["lora"], "r", c.lora.r), get(j["lora"], "alpha", c.lora.alpha), get(j["lora"], "dropout", c.lora.dropout);
      get(j["lora"], "targets", c.lora.targets), get(j["lora"], "bias", c.lora.bias);
      get(j["lora"], "vision", c.lora.vision);
    } catch (const std::exception& ex) {
      errs.push_back(std::string("conversion: ") + ex.what());
    }
    try {
      c.mod.config = mod_config_from_json(j["mod"]["config"], "mod.config");
    } catch (const std::exception& ex) {
      errs.push_back(ex.what());
    }
  }
  if (problems) {
    problems->insert(problems->end(), errs.begin(), errs.end());
  } else if (!errs.empty()) {
    std::string msg = source + ": " + std::to_string(errs.size()) + " problem(s):";
    for (const auto& e : errs) msg += "\n  " + e;
    throw std::invalid_argument(msg);
  }
  return c;
}

TrainConfig read_train_config(const std::string& path, const std::vector<std::string>& overrides,
                              std::vector<std::string>* problems) {
  json j = json::object();
  if (!path.empty()) {
    std::ifstream in(path);
    if (!in) throw std::invalid_argument("cannot open config file " + path);
    try {
      j = json::parse(in, nullptr, true, /*ignore_comments=*/true);
    } catch (const std::exception& e) {
      throw std::invalid_argument(path + ": not valid JSON: " + e.what());
    }
  }
  return train_config_from_json(j, overrides, path.empty() ? "config" : path, problems);
}

TrainConfig read_valid_train_config(const std::string& path, const std::vector<std::string>& overrides,
                                    int world, int ranks_on_node) {
  std::vector<std::string> problems;
  TrainConfig c = read_train_config(path, overrides, &problems);
  std::vector<std::string> bad_keys;
  for (const auto& p : problems) bad_keys.push_back(problem_key(p));
  for (auto& m : check_train_config(c, world, ranks_on_node)) {
    // A key that could not be read was validated at its default: what it says about that key is beside the
    // point.
    bool beside = false;
    for (const auto& k : bad_keys) beside = beside || about(m, k);
    if (!beside) problems.push_back(std::move(m));
  }
  if (problems.empty()) return c;
  std::string msg = (path.empty() ? std::string("config") : path) + ": invalid training config, " +
                    std::to_string(problems.size()) + " problem(s):";
  for (const auto& x : problems) msg += "\n  " + x;
  throw std::invalid_argument(msg);
}

std::vector<int> parse_layer_ranges(const std::vector<std::string>& ranges, int num_layers) {
  // Bounds first, expansion after: "0-2147483647" must not allocate one entry per index.
  const int64_t limit = num_layers >= 0 ? num_layers : int64_t(kMaxLayerIndex) + 1;
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const auto& r : ranges) {
    int64_t a = 0, b = 0;
    try {
      const auto dash = r.find('-', 1);  // "-1" is a (negative) number, not a range
      a = parse_integer<int64_t>(r.substr(0, dash));
      b = dash == std::string::npos ? a : parse_integer<int64_t>(r.substr(dash + 1));
      if (a < 0 || b < a) throw std::invalid_argument("order");
    } catch (const std::exception&) {
      throw std::invalid_argument("layer range \"" + r + "\": expected \"N\" or \"A-B\" with 0 <= A <= B");
    }
    if (b >= limit)
      throw std::invalid_argument(
          "layer range \"" + r + "\": layer " + std::to_string(b) + " does not exist (" +
          (num_layers >= 0 ? "the model has " + std::to_string(num_layers) + " layers, 0-" +
                                 std::to_string(num_layers - 1)
                           : "layer indices go up to " + std::to_string(kMaxLayerIndex)) +
          ")");
    spans.emplace_back(a, b);
  }
  std::set<int> out;
  for (const auto& [a, b] : spans)
    for (int64_t i = a; i <= b; ++i) out.insert(int(i));
  return {out.begin(), out.end()};
}

std::string effective_reduce_dtype(const TrainConfig& c) {
  return c.optimizer.reduce_dtype == "param" ? c.model.dtype : c.optimizer.reduce_dtype;
}

bool decays_weight(const std::string& name, const std::vector<std::string>& no_decay) {
  for (const auto& sub : no_decay)
    if (name.find(sub) != std::string::npos) return false;
  return true;
}

int grad_accum_steps(const TrainConfig& c, int world) {
  if (c.batch.global_batch > 0) return c.batch.global_batch / std::max(1, world * c.batch.micro_batch);
  return c.batch.grad_accum;
}

bool parse_device(const std::string& s, int* index) {
  *index = -1;
  if (s == "cpu" || s == "cuda") return true;
  if (s.rfind("cuda:", 0) != 0 || s.size() == 5 || s.size() > 9) return false;
  for (size_t i = 5; i < s.size(); ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  *index = std::stoi(s.substr(5));
  return true;
}

std::vector<std::string> check_config_fits_model(const TrainConfig& c, const LlavaConfig& m,
                                                 const std::string& model) {
  std::vector<std::string> e;
  const int n = m.text.num_hidden_layers, positions = m.text.max_position_embeddings;
  if (c.data.max_len > positions)
    e.push_back("data.max_len: " + std::to_string(c.data.max_len) +
                " is beyond the model's max_position_embeddings (" + std::to_string(positions) + ", " +
                model + ")");
  try {
    parse_layer_ranges(c.freeze.llm_layers, n);
  } catch (const std::exception& ex) {
    e.push_back(std::string("freeze.llm_layers: ") + ex.what());
  }
  if (c.mod.enabled) {
    for (size_t i = 0; i < c.mod.config.mod_layers.size(); ++i) {
      const int l = c.mod.config.mod_layers[i];
      if (l < 0 || l >= n)
        e.push_back("mod.config.mod_layers_idx[" + std::to_string(i) + "]: layer " + std::to_string(l) +
                    " does not exist (the model has " + std::to_string(n) + " layers, " + model + ")");
    }
    if (c.mod.config.mod_layers.empty()) {
      bool parsed = true;
      try {
        rule_needs_arank(c.mod.rule);
      } catch (const std::exception&) {
        parsed = false;  // check_train_config names the syntax error
      }
      try {  // a stand-in ARank: only whether the rule can select layers on this model is checked here
        if (parsed) config_for_rule(c.mod.rule, c.mod.config, n, std::vector<double>(size_t(std::max(n, 0)), 0.0));
      } catch (const std::exception& ex) {
        e.push_back(std::string("mod.rule: ") + ex.what() + " (" + model + ")");
      }
    }
  }
  return e;
}

std::vector<std::string> check_train_config(const TrainConfig& c, int world, int ranks_on_node) {
  std::vector<std::string> e;
  // Floats first: every one must be finite (NaN would pass the range checks below as `x < 0` is false).
  const std::pair<const char*, double> floats[] = {
      {"data.max_bad_fraction", c.data.max_bad_fraction},
      {"optimizer.lr", c.optimizer.lr},
      {"optimizer.beta1", c.optimizer.beta1},
      {"optimizer.beta2", c.optimizer.beta2},
      {"optimizer.eps", c.optimizer.eps},
      {"optimizer.weight_decay", c.optimizer.weight_decay},
      {"optimizer.warmup_ratio", c.optimizer.warmup_ratio},
      {"optimizer.min_lr", c.optimizer.min_lr},
      {"optimizer.max_grad_norm", c.optimizer.max_grad_norm},
      {"metrics.peak_tflops", c.metrics.peak_tflops},
      {"mod.config.skip_frac", c.mod.config.skip_frac},
      {"mod.config.router_aux_loss_coef", c.mod.config.router_aux_loss_coef},
      {"mod.config.infer_threshold", c.mod.config.infer_threshold},
      {"mod.config.decode_threshold", c.mod.config.decode_threshold}};
  for (const auto& [key, v] : floats)
    if (!std::isfinite(v)) e.push_back(std::string(key) + ": " + num(v) + " is not a finite number");
  auto need_file = [&](const std::string& key, const std::string& p) {
    if (p.empty()) e.push_back(key + ": required");
    else if (!fs::exists(p)) e.push_back(key + ": " + p + " does not exist");
  };
  // model
  if (c.model.dtype != "fp32" && c.model.dtype != "bf16")
    e.push_back("model.dtype: \"" + c.model.dtype + "\", expected fp32 or bf16");
  int device_index = -1;
  if (!parse_device(c.model.device, &device_index))
    e.push_back("model.device: \"" + c.model.device + "\", expected cpu, cuda or cuda:N");
  else if (device_index >= 0 && ranks_on_node > 1)
    e.push_back("model.device: \"" + c.model.device + "\" names one GPU, but " +
                std::to_string(ranks_on_node) +
                " ranks run on this node and would share it; use \"cuda\" (each rank takes GPU local_rank % "
                "device_count)");
  if (c.model.init != "pretrained" && c.model.init != "random")
    e.push_back("model.init: \"" + c.model.init + "\", expected pretrained or random");
  try {
    parse_activation_checkpointing(c.model.activation_checkpointing);
  } catch (const std::exception& ex) {
    e.push_back(std::string("model.activation_checkpointing: ") + ex.what());
  }
  const size_t model_errors = e.size();
  if (c.model.path.empty() == c.model.llm.empty()) {
    e.push_back(c.model.path.empty() ? "model.path or model.llm (+ model.vision, model.projector): one is required"
                                     : "model.path and model.llm are both set: give either a combined model directory "
                                       "or the parts");
  } else if (!c.model.path.empty()) {
    if (!fs::exists(fs::path(c.model.path) / "config.json"))
      e.push_back("model.path: " + c.model.path + "/config.json does not exist");
    if (!c.model.vision.empty() || !c.model.projector.empty() || !c.model.vision_slow.empty() ||
        !c.model.vision_aux.empty() || !c.model.image_grid_pinpoints.empty())
      e.push_back("model.vision / model.vision_slow / model.vision_aux / model.projector / model.image_grid_pinpoints: "
                  "only with model.llm (parts), not with model.path (its config.json says)");
  } else {
    for (auto [key, dir] : {std::pair<const char*, const std::string*>{"model.llm", &c.model.llm},
                            {"model.vision", &c.model.vision}})
      if (!dir->empty() && !fs::exists(fs::path(*dir) / "config.json"))
        e.push_back(std::string(key) + ": " + *dir + "/config.json does not exist");
    if (!c.model.projector.empty() && !fs::is_regular_file(c.model.projector))
      e.push_back("model.projector: " + c.model.projector + " is not a file");
    if (!c.model.projector.empty() && c.model.vision.empty())
      e.push_back("model.projector: needs model.vision (a projector maps vision features)");
    for (size_t i = 0; i < c.model.image_grid_pinpoints.size(); ++i) {
      const auto& p = c.model.image_grid_pinpoints[i];
      if (p.size() != 2 || p[0] <= 0 || p[1] <= 0)
        e.push_back("model.image_grid_pinpoints[" + std::to_string(i) + "]: " + json(p).dump() +
                    ", expected [height, width] in pixels, both positive");
    }
    if (!c.model.image_grid_pinpoints.empty() && (c.model.vision.empty() || !c.model.vision_slow.empty() ||
                                                   !c.model.vision_aux.empty()))
      e.push_back("model.image_grid_pinpoints: AnyRes tiles a single CLIP tower's input: needs model.vision and "
                  "neither model.vision_slow nor model.vision_aux");
    if (!c.model.vision_slow.empty() && c.model.freeze_vision != c.freeze.vision)
      e.push_back(std::string("model.freeze_vision (") + (c.model.freeze_vision ? "true" : "false") +
                  ", LLaVA-HR's flag: stitch adapters exist only when the towers train) and freeze.vision (" +
                  (c.freeze.vision ? "true" : "false") + ") disagree");
  }
  // freeze.llm_layers checked against the model's layers (else: syntax only, below)
  bool fits_checked = false;
  if (e.size() == model_errors) {
    // The model's config (JSON only, nothing allocated): its own problems, and the settings that must fit it.
    try {
      const LlavaConfig m = run_model_config(c.model);
      fits_checked = true;
      for (auto& x : check_config_fits_model(c, m, describe_model_source(c.model))) e.push_back(std::move(x));
    } catch (const std::exception& ex) {
      e.push_back(std::string("model: ") + ex.what());
    }
  }
  // data
  if (c.data.demo_records > 0) {
    const std::string name = fs::path(c.data.train).filename().string();
    if (name != "train.json" && name != "train.jsonl")
      e.push_back("data.train: with data.demo_records > 0 it must name <dir>/train.json or <dir>/train.jsonl");
  } else {
    need_file("data.train", c.data.train);
    if (!c.data.image_folder.empty() && !fs::is_directory(c.data.image_folder))
      e.push_back("data.image_folder: " + c.data.image_folder + " is not a directory");
  }
  need_file("data.tokenizer", !c.data.tokenizer.empty() ? c.data.tokenizer
                              : !c.model.path.empty() ? c.model.path
                                                      : c.model.llm);
  if (!is_conversation_template(c.data.template_name))
    e.push_back("data.template: \"" + c.data.template_name + "\", expected " + conversation_template_list());
  if (c.data.truncation != "turn" && c.data.truncation != "skip")
    e.push_back("data.truncation: \"" + c.data.truncation + "\", expected turn or skip");
  if (c.data.max_len < 8) e.push_back("data.max_len: " + std::to_string(c.data.max_len) + ", expected >= 8");
  if (c.data.pack_to != 0 && c.data.pack_to < c.data.max_len)
    e.push_back("data.pack_to: " + std::to_string(c.data.pack_to) + ", expected 0 (no packing) or >= data.max_len (" +
                std::to_string(c.data.max_len) + "), so that every sample fits a row");
  if (c.data.workers < 0 || c.data.workers > 256)
    e.push_back("data.workers: " + std::to_string(c.data.workers) + ", expected 0 to 256 (threads per rank)");
  if (c.data.prefetch < 1 || c.data.prefetch > 4096)
    e.push_back("data.prefetch: " + std::to_string(c.data.prefetch) +
                ", expected 1 to 4096 (micro-batches ahead)");
  if (c.data.demo_records < 0 || c.data.demo_records > 1000000)
    e.push_back("data.demo_records: " + std::to_string(c.data.demo_records) + ", expected 0 to 1000000");
  if (c.data.max_bad_fraction < 0 || c.data.max_bad_fraction > 1) e.push_back("data.max_bad_fraction: must be in [0, 1]");
  if (c.data.preflight_records == 0 || c.data.preflight_records < -1)
    e.push_back("data.preflight_records: " + std::to_string(c.data.preflight_records) + ", expected -1 (all) or >= 1");
  if (c.data.max_image_pixels < 1)
    e.push_back("data.max_image_pixels: " + std::to_string(c.data.max_image_pixels) + ", expected >= 1");
  const bool demo_eval = c.data.demo_records > 0 && fs::path(c.eval.data).parent_path() == fs::path(c.data.train).parent_path();
  if (!c.eval.data.empty() && !demo_eval && !fs::exists(c.eval.data)) e.push_back("eval.data: " + c.eval.data + " does not exist");
  if (c.eval.every < 0 || c.eval.max_batches < 0) e.push_back("eval.every / eval.max_batches: must be >= 0");
  // optimizer
  const auto& o = c.optimizer;
  if (!(o.lr > 0)) e.push_back("optimizer.lr: must be > 0");
  if (o.min_lr < 0 || o.min_lr > o.lr) e.push_back("optimizer.min_lr: must be in [0, lr]");
  if (o.beta1 < 0 || o.beta1 >= 1 || o.beta2 < 0 || o.beta2 >= 1) e.push_back("optimizer.beta1/beta2: must be in [0, 1)");
  if (!(o.eps > 0)) e.push_back("optimizer.eps: must be > 0");
  if (o.weight_decay < 0) e.push_back("optimizer.weight_decay: must be >= 0");
  if (o.warmup_ratio < 0 || o.warmup_ratio > 1) e.push_back("optimizer.warmup_ratio: must be in [0, 1]");
  if (o.warmup_steps < 0) e.push_back("optimizer.warmup_steps: must be >= 0");
  if (o.zero_stage < 0 || o.zero_stage > 3)
    e.push_back("optimizer.zero_stage: " + std::to_string(o.zero_stage) + ", expected 0, 1, 2 or 3");
  if (o.zero3_prefetch < 0 || o.zero3_prefetch > 8)
    e.push_back("optimizer.zero3_prefetch: " + std::to_string(o.zero3_prefetch) + ", expected 0..8 (units gathered ahead)");
  if (o.zero_stage == 3 && o.accumulate_fp32 && c.model.dtype == "bf16")
    e.push_back("optimizer.accumulate_fp32: not available with zero_stage 3 (its unit gradients accumulate in the "
                "params' dtype); use zero_stage 2 or accumulate_fp32 = false");
  if (o.bucket_mb < 1) e.push_back("optimizer.bucket_mb: must be >= 1");
  for (size_t i = 0; i < o.no_decay.size(); ++i)
    if (o.no_decay[i].empty())
      e.push_back("optimizer.no_decay[" + std::to_string(i) + "]: empty substring would exclude every parameter");
  if (o.reduce_dtype != "fp32" && o.reduce_dtype != "bf16" && o.reduce_dtype != "param")
    e.push_back("optimizer.reduce_dtype: \"" + o.reduce_dtype + "\", expected fp32, bf16 or param");
  else if (o.accumulate_fp32 && c.model.dtype == "bf16" && o.reduce_dtype != "fp32")
    e.push_back("optimizer.reduce_dtype: \"" + o.reduce_dtype + "\" rounds the fp32-accumulated gradients "
                "(optimizer.accumulate_fp32 = true) to bf16 before averaging; use fp32");
  if (o.offload != "none" && o.offload != "cpu")
    e.push_back("optimizer.offload: \"" + o.offload + "\", expected \"none\" or \"cpu\" (fp32 master and moments in "
                "host memory, AdamW on CPU threads)");
  for (auto& m : check_param_groups(o)) e.push_back(std::move(m));
  // batch
  if (c.batch.micro_batch < 1) e.push_back("batch.micro_batch: must be >= 1");
  if (c.batch.global_batch < 0) e.push_back("batch.global_batch: must be >= 0");
  if (c.batch.global_batch > 0) {
    const int64_t per_micro = int64_t(world) * std::max(1, c.batch.micro_batch);
    if (c.batch.global_batch % per_micro != 0)
      e.push_back("batch.global_batch: " + std::to_string(c.batch.global_batch) + " is not a multiple of world size (" +
                  std::to_string(world) + ") x micro_batch (" + std::to_string(c.batch.micro_batch) + ")");
  } else if (c.batch.grad_accum < 1) {
    e.push_back("batch.grad_accum: " + std::to_string(c.batch.grad_accum) + ", must be >= 1");
  } else if (int64_t(world) * std::max(1, c.batch.micro_batch) * c.batch.grad_accum > INT_MAX) {
    e.push_back("batch.grad_accum: world size (" + std::to_string(world) + ") x micro_batch (" +
                std::to_string(c.batch.micro_batch) + ") x grad_accum (" +
                std::to_string(c.batch.grad_accum) + ") samples per step is out of range (at most " +
                std::to_string(INT_MAX) + ")");
  }
  // schedule
  if (c.schedule.max_steps < 0 || c.schedule.exit_at_step < 0) e.push_back("schedule.max_steps / exit_at_step: must be >= 0");
  if (c.schedule.max_steps == 0 && c.schedule.epochs < 1) e.push_back("schedule.epochs: must be >= 1 when max_steps = 0");
  // freeze
  try {
    if (!fits_checked) parse_layer_ranges(c.freeze.llm_layers);
  } catch (const std::exception& ex) {
    e.push_back(std::string("freeze.llm_layers: ") + ex.what());
  }
  if (c.freeze.vision && c.freeze.projector && c.freeze.llm) e.push_back("freeze: everything is frozen, nothing to train");
  // mod
  if (c.mod.enabled && c.mod.config.mod_layers.empty()) {
    try {
      rule_needs_arank(c.mod.rule);
    } catch (const std::exception& ex) {
      e.push_back(std::string("mod.rule: ") + ex.what());
    }
  }
  if (c.mod.arank_samples < 1) e.push_back("mod.arank_samples: must be >= 1");
  if (c.mod.arank_protocol != "paper" && c.mod.arank_protocol != "training")
    e.push_back("mod.arank_protocol: \"" + c.mod.arank_protocol + "\", expected paper or training");
  // checkpoint / metrics / run
  if (c.checkpoint.every < 0) e.push_back("checkpoint.every: must be >= 0");
  if (c.checkpoint.keep_last == 1 || c.checkpoint.keep_last < 0)
    e.push_back("checkpoint.keep_last: " + std::to_string(c.checkpoint.keep_last) +
                ", expected 0 (all) or >= 2 (the newest may be incomplete when a job dies)");
  if (c.metrics.log_every < 1) e.push_back("metrics.log_every: must be >= 1");
  if (c.metrics.peak_tflops < 0) e.push_back("metrics.peak_tflops: must be >= 0");
  try {
    parse_step_range(c.metrics.profile_steps, "metrics.profile_steps");
  } catch (const std::invalid_argument& ex) {
    e.push_back(ex.what());
  }
  if (c.run_dir.empty()) e.push_back("run_dir: required");
  if (c.resume != "auto" && c.resume != "auto_or_scratch" && c.resume != "none" &&
      !fs::exists(fs::path(c.resume) / "manifest.json"))
    e.push_back("resume: \"" + c.resume +
                "\" is neither auto, auto_or_scratch, none nor a checkpoint directory with manifest.json");
  if (c.max_consecutive_skipped < 1) e.push_back("max_consecutive_skipped: must be >= 1");
  for (const auto& x : check_lora_config(c.lora)) e.push_back(x);  // lora.*
  if (c.lora.enabled() && c.freeze.llm)
    e.push_back("lora.r: LoRA trains adapters on the LLM, but freeze.llm = true freezes them too; set freeze.llm = "
                "false (the LLM's own weights are frozen by LoRA)");
  if (c.lora.enabled() && c.optimizer.zero_stage == 3)
    e.push_back("lora.r: LoRA with optimizer.zero_stage 3 is not built (the frozen LLM would stay whole on every rank "
                "anyway); use zero_stage 0, 1 or 2");
  const std::pair<const char*, double> deadlines[] = {
      {"parallel.timeout_s", c.parallel.timeout_s},
      {"parallel.arank_timeout_s", c.parallel.arank_timeout_s},
      {"parallel.resume_check_timeout_s", c.parallel.resume_check_timeout_s},
      {"parallel.save_timeout_s", c.parallel.save_timeout_s}};
  for (const auto& [key, v] : deadlines)
    if (!(v > 0) || !std::isfinite(v))
      e.push_back(std::string(key) + ": " + std::to_string(v) + ", expected a finite number > 0");
  return e;
}

void validate_train_config(const TrainConfig& c, int world, int ranks_on_node) {
  auto errs = check_train_config(c, world, ranks_on_node);
  if (errs.empty()) return;
  std::string msg = "invalid training config, " + std::to_string(errs.size()) + " problem(s):";
  for (const auto& x : errs) msg += "\n  " + x;
  throw std::invalid_argument(msg);
}

}  // namespace gmod

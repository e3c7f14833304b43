#include "mod/mod_config.h"

#include "mod/method_registry.h"
#include "mod/token_selection.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace gmod {

namespace {

template <typename E>
struct EnumNames;
template <>
struct EnumNames<RouterKind> {
  static constexpr const char* what = "router";
  static std::vector<std::pair<RouterKind, const char*>> all() {
    return {{RouterKind::kGammaShared, "gamma_shared"}, {RouterKind::kPerLayer, "per_layer"},
            {RouterKind::kAttention, "attention"}, {RouterKind::kFastV, "fastv"},
            {RouterKind::kPMoD, "pmod"}, {RouterKind::kPDrop, "pdrop"}};
  }
};
template <>
struct EnumNames<ForcedKeep> {
  static constexpr const char* what = "forced_keep";
  static std::vector<std::pair<ForcedKeep, const char*>> all() {
    return {{ForcedKeep::kQuestions, "questions"}, {ForcedKeep::kQuestionsAnswers, "questions_answers"}};
  }
};
template <>
struct EnumNames<RopePositions> {
  static constexpr const char* what = "rope_positions";
  static std::vector<std::pair<RopePositions, const char*>> all() {
    return {{RopePositions::kCompacted, "compacted"}, {RopePositions::kOriginal, "original"}};
  }
};
template <>
struct EnumNames<RoutingMode> {
  static constexpr const char* what = "mode";
  static std::vector<std::pair<RoutingMode, const char*>> all() {
    return {{RoutingMode::kAuto, "auto"}, {RoutingMode::kTopK, "topk"}, {RoutingMode::kThreshold, "threshold"}};
  }
};
template <>
struct EnumNames<AmodSkippedScore> {
  static constexpr const char* what = "amod_skipped";
  static std::vector<std::pair<AmodSkippedScore, const char*>> all() {
    return {{AmodSkippedScore::kInterleaved, "interleaved"},
            {AmodSkippedScore::kCarry, "carry"},
            {AmodSkippedScore::kForceKeep, "force_keep"}};
  }
};
template <>
struct EnumNames<AmodRoutable> {
  static constexpr const char* what = "amod_routable";
  static std::vector<std::pair<AmodRoutable, const char*>> all() {
    return {{AmodRoutable::kAll, "all"}, {AmodRoutable::kRoles, "roles"}};
  }
};

template <>
struct EnumNames<AdaptiveThreshold> {
  static constexpr const char* what = "adaptive_threshold";
  static std::vector<std::pair<AdaptiveThreshold, const char*>> all() {
    return {{AdaptiveThreshold::kNone, "none"}, {AdaptiveThreshold::kSeqLen, "seqlen"}, {AdaptiveThreshold::kARank, "arank"}};
  }
};

template <>
struct EnumNames<PModSchedule> {
  static constexpr const char* what = "pmod_schedule";
  static std::vector<std::pair<PModSchedule, const char*>> all() {
    return {{PModSchedule::kShiftedCos, "shiftedcos"}, {PModSchedule::kShiftedLinear, "shiftedlinear"}};
  }
};
template <>
struct EnumNames<PModDenominator> {
  static constexpr const char* what = "pmod_denominator";
  static std::vector<std::pair<PModDenominator, const char*>> all() {
    return {{PModDenominator::kDepth, "depth"}, {PModDenominator::kOfficial31, "official_31"}};
  }
};
template <>
struct EnumNames<PModWeightNorm> {
  static constexpr const char* what = "pmod_weight_norm";
  static std::vector<std::pair<PModWeightNorm, const char*>> all() {
    return {{PModWeightNorm::kTanh, "tanh"}, {PModWeightNorm::kNone, "none"}};
  }
};

template <>
struct EnumNames<CapacityRule> {
  static constexpr const char* what = "capacity_rule";
  static std::vector<std::pair<CapacityRule, const char*>> all() {
    return {{CapacityRule::kRoles, "roles"}, {CapacityRule::kOfficialPrefix, "official_prefix"}};
  }
};

template <>
struct EnumNames<PDropUnanswered> {
  static constexpr const char* what = "pdrop_unanswered";
  static std::vector<std::pair<PDropUnanswered, const char*>> all() {
    return {{PDropUnanswered::kLastToken, "last_token"}, {PDropUnanswered::kKeepAll, "keep_all"}};
  }
};

template <typename E>
std::string name_of(E e) {
  for (auto& [v, n] : EnumNames<E>::all())
    if (v == e) return n;
  return "?";
}

template <typename E>
E parse_enum(const std::string& s, const std::string& source) {
  std::string options;
  for (auto& [v, n] : EnumNames<E>::all()) {
    if (s == n) return v;
    options += std::string(options.empty() ? "" : ", ") + n;
  }
  throw std::invalid_argument(source + ": " + EnumNames<E>::what + " = \"" + s + "\", expected one of " + options);
}

}  // namespace

std::string to_string(RouterKind k) { return name_of(k); }
RouterKind router_kind(const std::string& name, const std::string& source) {
  return parse_enum<RouterKind>(name, source);
}
std::string to_string(ForcedKeep k) { return name_of(k); }
std::string to_string(RopePositions k) { return name_of(k); }
std::string to_string(RoutingMode k) { return name_of(k); }
std::string to_string(AmodSkippedScore k) { return name_of(k); }
std::string to_string(AmodRoutable k) { return name_of(k); }
std::string to_string(AdaptiveThreshold k) { return name_of(k); }
std::string to_string(PModSchedule k) { return name_of(k); }
std::string to_string(PModDenominator k) { return name_of(k); }
std::string to_string(PModWeightNorm k) { return name_of(k); }
std::string to_string(PDropUnanswered k) { return name_of(k); }
std::string to_string(CapacityRule k) { return name_of(k); }

bool MoDConfig::is_mod_layer(int i) const {
  return std::find(mod_layers.begin(), mod_layers.end(), i) != mod_layers.end();
}

void validate(const MoDConfig& c, int num_layers, const std::string& source) {
  std::ostringstream err;
  for (size_t i = 0; i < c.mod_layers.size(); ++i) {
    const int l = c.mod_layers[i];
    if (l < 0 || l >= num_layers) err << "\n  mod_layers[" << i << "] = " << l << " outside [0, " << num_layers << ")";
    if (i > 0 && l <= c.mod_layers[i - 1]) err << "\n  mod_layers must be sorted and unique (at index " << i << ")";
  }
  if (!(c.skip_frac >= 0.0 && c.skip_frac <= 1.0)) err << "\n  skip_frac = " << c.skip_frac << ", expected [0, 1]";
  if (!(c.router_aux_loss_coef >= 0.0)) err << "\n  router_aux_loss_coef must be >= 0";
  if (!(c.infer_threshold >= 0.0 && c.infer_threshold < 1.0)) err << "\n  infer_threshold expected in [0, 1)";
  if (!(c.decode_threshold >= 0.0 && c.decode_threshold <= 1.0)) err << "\n  decode_threshold expected in [0, 1]";
  if (c.router_init != "kaiming_uniform" && c.router_init != "xavier_uniform" && c.router_init != "zero")
    err << "\n  router_init = \"" << c.router_init << "\", expected kaiming_uniform, xavier_uniform or zero";
  // The method's own checks (its file pair, mod/select_*.cpp), around the shared capacity ones.
  const TokenSelector& method = method_for(c.router);
  method.check_layers(c, num_layers, err);
  if (c.capacity_rule == CapacityRule::kOfficialPrefix && !method.official_prefix_capacity())
    err << "\n  capacity_rule \"official_prefix\" reproduces γ-MoD's code; router " << to_string(c.router)
        << " routes by its own capacity (use router gamma_shared or capacity_rule \"roles\")";
  if (c.official_prefix < 1) err << "\n  official_prefix = " << c.official_prefix << ", expected >= 1";
  method.check_section(c, num_layers, err);
  if (c.adaptive_threshold != AdaptiveThreshold::kNone && !method.has_thresholds())
    err << "\n  adaptive_threshold = \"" << to_string(c.adaptive_threshold) << "\" adapts the router thresholds; router "
        << to_string(c.router) << " has none";
  if (c.adaptive_threshold == AdaptiveThreshold::kSeqLen && !(c.avg_seqlen > 0.0))
    err << "\n  adaptive_threshold \"seqlen\" needs avg_seqlen > 0 (the mean token count of the tuning data), got "
        << c.avg_seqlen;
  if (c.adaptive_threshold == AdaptiveThreshold::kARank) {
    if (c.layer_arank.size() != c.mod_layers.size())
      err << "\n  adaptive_threshold \"arank\" needs layer_arank with one ARank per MoD layer (" << c.mod_layers.size()
          << "), got " << c.layer_arank.size();
    for (size_t i = 0; i < c.layer_arank.size(); ++i)
      if (!(c.layer_arank[i] > 0.0)) err << "\n  layer_arank[" << i << "] = " << c.layer_arank[i] << ", expected > 0";
  }
  const auto msg = err.str();
  if (!msg.empty()) throw std::invalid_argument(source + ": invalid MoD config:" + msg);
}

nlohmann::json to_json(const MoDConfig& c) {
  return nlohmann::json{{"mod_enable", true},
                        {"mod_layers_idx", c.mod_layers},
                        {"router", to_string(c.router)},
                        {"skip_frac", c.skip_frac},
                        {"forced_keep", to_string(c.forced_keep)},
                        {"capacity_rule", to_string(c.capacity_rule)},
                        {"official_prefix", c.official_prefix},
                        {"rope_positions", to_string(c.rope_positions)},
                        {"router_aux_loss_coef", c.router_aux_loss_coef},
                        {"infer_threshold", c.infer_threshold},
                        {"decode_threshold", c.decode_threshold},
                        {"decode_skip", c.decode_skip},
                        {"scale_by_router", c.scale_by_router},
                        {"router_init", c.router_init},
                        {"router_init_seed", c.router_init_seed},
                        {"amod_causal_normalise", c.amod_causal_normalise},
                        {"amod_skipped", to_string(c.amod_skipped)},
                        {"amod_routable", to_string(c.amod_routable)},
                        {"mode", to_string(c.mode)},
                        {"selection", c.selection},
                        {"fastv_k", c.fastv_k},
                        {"fastv_r", c.fastv_r},
                        {"adaptive_threshold", to_string(c.adaptive_threshold)},
                        {"avg_seqlen", c.avg_seqlen},
                        {"avg_seqlen_source", c.avg_seqlen_source},
                        {"layer_arank", c.layer_arank},
                        {"pmod_schedule", to_string(c.pmod_schedule)},
                        {"pmod_denominator", to_string(c.pmod_denominator)},
                        {"pmod_factor", c.pmod_factor},
                        {"pmod_max_ratio", c.pmod_max_ratio},
                        {"pmod_min_ratio", c.pmod_min_ratio},
                        {"pmod_weight_norm", to_string(c.pmod_weight_norm)},
                        {"pmod_tanh_scale", c.pmod_tanh_scale},
                        {"pmod_tanh_bias", c.pmod_tanh_bias},
                        {"pmod_router_bias", c.pmod_router_bias},
                        {"pdrop_layers", c.pdrop_layers},
                        {"pdrop_ratios", c.pdrop_ratios},
                        {"pdrop_unanswered", to_string(c.pdrop_unanswered)}};
}

MoDConfig mod_config_from_json(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw std::invalid_argument(source + ": MoD config must be a JSON object");
  static const std::vector<std::string> known = {
      "mod_enable", "mod_layers_idx", "router", "skip_frac", "forced_keep", "rope_positions",
      "router_aux_loss_coef", "infer_threshold", "decode_threshold", "decode_skip", "scale_by_router",
      "router_init", "router_init_seed", "amod_causal_normalise", "amod_skipped", "amod_routable", "mode",
      "selection", "fastv_k", "fastv_r", "adaptive_threshold", "avg_seqlen", "layer_arank",
      "avg_seqlen_source", "pmod_schedule", "pmod_denominator", "pmod_factor", "pmod_max_ratio", "pmod_min_ratio",
      "pmod_weight_norm", "pmod_tanh_scale", "pmod_tanh_bias", "pmod_router_bias", "pdrop_layers", "pdrop_ratios",
      "pdrop_unanswered", "capacity_rule", "official_prefix",
      // γ-MoD's own config.mod (its MoDLLaVALlamaConfig): mod_mode is the layer rule it chose the layers by
      // (kept as `selection`); capacity_factor is stored but its routing formula does not read it (mod-spec.md:
      // the 0.5 is hard-coded), so it is accepted and does not change skip_frac.
      "mod_mode", "capacity_factor"};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (std::find(known.begin(), known.end(), it.key()) == known.end())
      throw std::invalid_argument(source + ": unknown MoD config key \"" + it.key() + "\"");
  MoDConfig c;
  try {
    if (j.contains("mod_layers_idx")) c.mod_layers = j.at("mod_layers_idx").get<std::vector<int>>();
    if (j.contains("router")) c.router = parse_enum<RouterKind>(j.at("router").get<std::string>(), source);
    if (j.contains("skip_frac")) c.skip_frac = j.at("skip_frac").get<double>();
    if (j.contains("forced_keep"))
      c.forced_keep = parse_enum<ForcedKeep>(j.at("forced_keep").get<std::string>(), source);
    if (j.contains("capacity_rule"))
      c.capacity_rule = parse_enum<CapacityRule>(j.at("capacity_rule").get<std::string>(), source);
    if (j.contains("official_prefix")) c.official_prefix = j.at("official_prefix").get<int>();
    if (j.contains("rope_positions"))
      c.rope_positions = parse_enum<RopePositions>(j.at("rope_positions").get<std::string>(), source);
    if (j.contains("router_aux_loss_coef")) c.router_aux_loss_coef = j.at("router_aux_loss_coef").get<double>();
    if (j.contains("infer_threshold")) c.infer_threshold = j.at("infer_threshold").get<double>();
    if (j.contains("decode_threshold")) c.decode_threshold = j.at("decode_threshold").get<double>();
    if (j.contains("decode_skip")) c.decode_skip = j.at("decode_skip").get<bool>();
    if (j.contains("scale_by_router")) c.scale_by_router = j.at("scale_by_router").get<bool>();
    if (j.contains("router_init")) c.router_init = j.at("router_init").get<std::string>();
    if (j.contains("router_init_seed")) c.router_init_seed = j.at("router_init_seed").get<uint64_t>();
    if (j.contains("amod_causal_normalise")) c.amod_causal_normalise = j.at("amod_causal_normalise").get<bool>();
    if (j.contains("amod_skipped"))
      c.amod_skipped = parse_enum<AmodSkippedScore>(j.at("amod_skipped").get<std::string>(), source);
    if (j.contains("amod_routable"))
      c.amod_routable = parse_enum<AmodRoutable>(j.at("amod_routable").get<std::string>(), source);
    if (j.contains("mode")) c.mode = parse_enum<RoutingMode>(j.at("mode").get<std::string>(), source);
    if (j.contains("selection")) c.selection = j.at("selection").get<std::string>();
    else if (j.contains("mod_mode") && j.at("mod_mode").is_string())
      c.selection = j.at("mod_mode").get<std::string>();
    if (j.contains("capacity_factor") && !j.at("capacity_factor").is_number())
      throw std::invalid_argument(source + ": capacity_factor must be a number, not " +
                                  j.at("capacity_factor").dump());
    if (j.contains("fastv_k")) c.fastv_k = j.at("fastv_k").get<int>();
    if (j.contains("fastv_r")) c.fastv_r = j.at("fastv_r").get<double>();
    if (j.contains("adaptive_threshold"))
      c.adaptive_threshold = parse_enum<AdaptiveThreshold>(j.at("adaptive_threshold").get<std::string>(), source);
    if (j.contains("avg_seqlen")) c.avg_seqlen = j.at("avg_seqlen").get<double>();
    if (j.contains("avg_seqlen_source")) c.avg_seqlen_source = j.at("avg_seqlen_source").get<std::string>();
    if (j.contains("layer_arank")) c.layer_arank = j.at("layer_arank").get<std::vector<double>>();
    if (j.contains("pmod_schedule"))
      c.pmod_schedule = parse_enum<PModSchedule>(j.at("pmod_schedule").get<std::string>(), source);
    if (j.contains("pmod_denominator"))
      c.pmod_denominator = parse_enum<PModDenominator>(j.at("pmod_denominator").get<std::string>(), source);
    if (j.contains("pmod_factor")) c.pmod_factor = j.at("pmod_factor").get<double>();
    if (j.contains("pmod_max_ratio")) c.pmod_max_ratio = j.at("pmod_max_ratio").get<double>();
    if (j.contains("pmod_min_ratio")) c.pmod_min_ratio = j.at("pmod_min_ratio").get<double>();
    if (j.contains("pmod_weight_norm"))
      c.pmod_weight_norm = parse_enum<PModWeightNorm>(j.at("pmod_weight_norm").get<std::string>(), source);
    if (j.contains("pmod_tanh_scale")) c.pmod_tanh_scale = j.at("pmod_tanh_scale").get<double>();
    if (j.contains("pmod_tanh_bias")) c.pmod_tanh_bias = j.at("pmod_tanh_bias").get<double>();
    if (j.contains("pmod_router_bias")) c.pmod_router_bias = j.at("pmod_router_bias").get<bool>();
    if (j.contains("pdrop_layers")) c.pdrop_layers = j.at("pdrop_layers").get<std::vector<int>>();
    if (j.contains("pdrop_ratios")) c.pdrop_ratios = j.at("pdrop_ratios").get<std::vector<double>>();
    if (j.contains("pdrop_unanswered"))
      c.pdrop_unanswered = parse_enum<PDropUnanswered>(j.at("pdrop_unanswered").get<std::string>(), source);
    method_for(c.router).apply_defaults(j, c);  // the method's own defaults where the object does not say otherwise
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(source + ": bad MoD config value: " + e.what());
  }
  return c;
}

}  // namespace gmod

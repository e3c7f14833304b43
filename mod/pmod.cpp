#include "mod/pmod.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <stdexcept>

namespace gmod {

namespace {

double denominator(const MoDConfig& c, int num_layers) {
  return c.pmod_denominator == PModDenominator::kOfficial31 ? 31.0 : static_cast<double>(num_layers - 1);
}

std::string list(const std::vector<int>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

}  // namespace

double pmod_decay(const MoDConfig& c, int layer, int num_layers) {
  const double n = denominator(c, num_layers);
  const double l = static_cast<double>(layer);
  // The original's expressions, operation for operation (llava/model/language_model/pmod_llava_llama.py).
  if (c.pmod_schedule == PModSchedule::kShiftedLinear) return (-l / n + 0.5) + c.pmod_factor;
  return std::cos(l * M_PI / n) / 2 + c.pmod_factor;
}

double pmod_ratio(const MoDConfig& c, int layer, int num_layers) {
  return std::max(pmod_decay(c, layer, num_layers), c.pmod_min_ratio);
}

std::vector<int> pmod_layers(const MoDConfig& c, int num_layers) {
  std::vector<int> out;
  for (int i = 0; i < num_layers; ++i)
    if (pmod_decay(c, i, num_layers) <= c.pmod_max_ratio) out.push_back(i);
  return out;
}

int64_t pmod_kept_images(int64_t n_img, double ratio) {
  // torch.trunc(int32 lengths * python float): the product is a float32 tensor.
  const float p = static_cast<float>(n_img) * static_cast<float>(ratio);
  return static_cast<int64_t>(std::trunc(p));
}

void validate_pmod(const MoDConfig& c, int num_layers, std::ostream& err) {
  if (c.pmod_denominator == PModDenominator::kDepth && num_layers < 2)
    err << "\n  pmod_denominator \"depth\" needs at least 2 layers (num_layers - 1 > 0)";
  if (!(c.pmod_min_ratio >= 0.0 && c.pmod_min_ratio <= 1.0))
    err << "\n  pmod_min_ratio = " << c.pmod_min_ratio << ", expected [0, 1]";
  if (!(c.pmod_max_ratio >= c.pmod_min_ratio))
    err << "\n  pmod_max_ratio = " << c.pmod_max_ratio << " is below pmod_min_ratio = " << c.pmod_min_ratio;
  if (!std::isfinite(c.pmod_factor)) err << "\n  pmod_factor must be finite";
  if (!std::isfinite(c.pmod_tanh_scale) || !std::isfinite(c.pmod_tanh_bias))
    err << "\n  pmod_tanh_scale and pmod_tanh_bias must be finite";
  if (c.rope_positions != RopePositions::kOriginal)
    err << "\n  router pmod: rope_positions must be \"original\" (p-MoD's kept tokens keep their positions)";
  if (num_layers >= 2 || c.pmod_denominator == PModDenominator::kOfficial31) {
    const auto want = pmod_layers(c, num_layers);
    if (c.mod_layers != want)
      err << "\n  router pmod: mod_layers_idx = " << list(c.mod_layers) << " but the schedule (pmod_schedule "
          << to_string(c.pmod_schedule) << ", pmod_factor " << c.pmod_factor << ", pmod_max_ratio " << c.pmod_max_ratio
          << ", pmod_denominator " << to_string(c.pmod_denominator) << ") routes the layers " << list(want)
          << " of " << num_layers;
  }
}

MoDConfig pmod_config(int num_layers, PModDenominator d) {
  MoDConfig c;
  c.router = RouterKind::kPMoD;
  c.pmod_denominator = d;
  c.rope_positions = RopePositions::kOriginal;
  c.router_init = "zero";  // mod_special_init
  c.router_aux_loss_coef = 0.0;
  c.mod_layers = pmod_layers(c, num_layers);
  c.selection = "pmod_schedule";
  validate(c, num_layers, "pmod_config");
  return c;
}

bool is_pmod_rule(const std::string& rule) { return rule == "pmod" || rule == "pmod:official_31"; }

MoDConfig pmod_rule_config(const std::string& rule, const MoDConfig& base, int num_layers) {
  if (!is_pmod_rule(rule))
    throw std::invalid_argument("rule \"" + rule + "\" is not p-MoD's (pmod or pmod:official_31)");
  const PModDenominator d = rule == "pmod" ? PModDenominator::kDepth : PModDenominator::kOfficial31;
  MoDConfig c = base;
  if (base.router != RouterKind::kPMoD) {
    c = pmod_config(num_layers, d);
  } else {
    c.pmod_denominator = d;
    c.mod_layers = pmod_layers(c, num_layers);
    c.selection = "pmod_schedule";
  }
  if (c.mod_layers.empty())  // a run that asked for p-MoD must not train densely without a word
    throw std::invalid_argument("rule " + rule + " routes no layer of this " + std::to_string(num_layers) +
                                "-layer LLM: the schedule's ratio stays above pmod_max_ratio (" +
                                std::to_string(c.pmod_max_ratio) + ") at every layer");
  validate(c, num_layers, "mod.rule " + rule);
  return c;
}

MoDConfig pmod_config_from_official(const nlohmann::json& j, int num_layers, PModDenominator d,
                                    const std::string& source) {
  MoDConfig c = pmod_config(num_layers, d);
  auto str = [&](const char* key) {
    if (!j.contains(key) || !j.at(key).is_string())
      throw std::invalid_argument(source + ": p-MoD config needs the string \"" + key + "\"");
    return j.at(key).get<std::string>();
  };
  const std::string layers = str("mod_target_layers");
  std::smatch m;
  static const std::regex decay(R"((\w+)_decay_(\d+\.\d+)_(\d+\.\d+))");  // the original's pattern
  if (!std::regex_match(layers, m, decay))
    throw std::invalid_argument(source + ": mod_target_layers = \"" + layers +
                                "\": gmod reads the progressive-decay form <shiftedcos|shiftedlinear>_decay_<max>_<min> "
                                "(the fixed-ratio deep_all / interleave layouts are not p-MoD's schedule)");
  if (m[1] == "shiftedcos") c.pmod_schedule = PModSchedule::kShiftedCos;
  else if (m[1] == "shiftedlinear") c.pmod_schedule = PModSchedule::kShiftedLinear;
  else
    throw std::invalid_argument(source + ": mod_target_layers = \"" + layers + "\": unknown decay \"" +
                                m[1].str() + "\" (shiftedcos, shiftedlinear)");
  c.pmod_max_ratio = std::stod(m[2].str());
  c.pmod_min_ratio = std::stod(m[3].str());
  if (!j.contains("mod_router_factor") || !j.at("mod_router_factor").is_number())
    throw std::invalid_argument(source + ": p-MoD config needs the number \"mod_router_factor\"");
  c.pmod_factor = j.at("mod_router_factor").get<double>();
  const std::string norm = str("mod_weight_norm");
  static const std::regex norm_re(R"((\w+)_(\d+\.\d+|\d+)_(-?\d+\.\d+|-?\d+))");
  std::smatch n;
  if (std::regex_match(norm, n, norm_re) && n[1] == "tanh") {
    c.pmod_weight_norm = PModWeightNorm::kTanh;
    c.pmod_tanh_scale = std::stod(n[2].str());
    c.pmod_tanh_bias = std::stod(n[3].str());
  } else if (norm == "tanh") {  // the original's default scale 1, bias 1
    c.pmod_weight_norm = PModWeightNorm::kTanh;
    c.pmod_tanh_scale = c.pmod_tanh_bias = 1.0;
  } else {
    throw std::invalid_argument(source + ": mod_weight_norm = \"" + norm +
                                "\": gmod's p-MoD implements TanhNorm only (tanh or tanh_<scale>_<bias>)");
  }
  c.pmod_router_bias = j.value("mod_bias_enabled", false);
  const std::string target = str("mod_target_token_type");
  if (target != "vision_all")
    throw std::invalid_argument(source + ": mod_target_token_type = \"" + target +
                                "\": gmod routes the image tokens (vision_all); \"all\" and LLaVA-NeXT's vision_hr are "
                                "not implemented");
  c.mod_layers = pmod_layers(c, num_layers);
  if (j.contains("mod_target_layer_indices") && j.at("mod_target_layer_indices").is_array() &&
      j.at("mod_target_layer_indices").get<std::vector<int>>() != c.mod_layers)
    throw std::invalid_argument(source + ": mod_target_layer_indices = " + j.at("mod_target_layer_indices").dump() +
                                " but the schedule with pmod_denominator " + to_string(d) + " gives " +
                                list(c.mod_layers));
  c.selection = layers;
  validate(c, num_layers, source);
  return c;
}

PModRouterImpl::PModRouterImpl(int64_t hidden, bool with_bias, const std::string& init, uint64_t seed,
                               at::TensorOptions opts) {
  auto cpu = at::TensorOptions().dtype(at::kFloat);
  at::Tensor w;
  if (init == "zero") {
    w = at::zeros({1, hidden}, cpu);
  } else {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    const double b = init == "xavier_uniform" ? std::sqrt(6.0 / static_cast<double>(hidden + 1))
                                              : 1.0 / std::sqrt(static_cast<double>(hidden));
    w = at::empty({1, hidden}, cpu).uniform_(-b, b, gen);
  }
  weight = register_parameter("weight", w.to(opts));
  if (with_bias) bias = register_parameter("bias", at::zeros({1}, cpu).to(opts));
}

at::Tensor PModRouterImpl::logits(const at::Tensor& x) const {
  const auto ct = router_compute_dtype(x);
  return at::linear(x.to(ct), weight.to(ct), bias.defined() ? bias.to(ct) : at::Tensor()).squeeze(-1);
}

at::Tensor pmod_weight(const MoDConfig& c, const at::Tensor& r) {
  // The original: weight_normalization(r) = act(r) * scale + bias.
  const auto act = c.pmod_weight_norm == PModWeightNorm::kTanh ? at::tanh(r) : r;
  return act * c.pmod_tanh_scale + c.pmod_tanh_bias;
}

HostCapacity pmod_capacity(const at::Tensor& host_counts, double ratio) {
  if (host_counts.dim() != 2 || host_counts.size(1) != kHostCountColumns || !host_counts.device().is_cpu())
    throw std::invalid_argument("p-MoD layer: host_role_counts must be a [B, 4] CPU tensor (count_routing_roles)");
  const auto counts = host_counts.to(at::kLong).contiguous();
  const auto a = counts.accessor<int64_t, 2>();
  HostCapacity h;
  for (int64_t b = 0; b < counts.size(0); ++b) {
    const int64_t valid = a[b][kCountValid], n_img = a[b][kCountImage];
    const int64_t k = valid - n_img + pmod_kept_images(n_img, ratio);
    h.valid.push_back(valid);
    h.routable.push_back(n_img);
    h.k.push_back(k);
    h.kmax = std::max(h.kmax, k);
  }
  return h;
}

at::Tensor pmod_capacity(const RoutingMasks& m, double ratio) {
  const auto n_img = m.routable.sum(1);  // [B] int64
  // torch.trunc(int32 lengths * python float) in float32, as pmod_kept_images on the host.
  const auto kept = (n_img.to(at::kFloat) * static_cast<float>(ratio)).trunc().to(at::kLong);
  return m.valid.sum(1) - n_img + kept;
}

}  // namespace gmod

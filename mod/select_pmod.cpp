#include "mod/select_pmod.h"

#include <nlohmann/json.hpp>
#include <stdexcept>

#include "mod/method_registry.h"
#include "mod/pmod.h"
#include "mod/pmod_checkpoint.h"
#include "model/model_types.h"

namespace gmod {

void PModSelector::attach(MoDDecoderLayer& layer, const DenseDecoderLayer& d, int layer_idx) const {
  const auto& cfg = layer.cfg;
  const auto& w = d.self_attn->q_proj->weight;
  layer.pmod_router = layer.register_router(std::make_shared<PModRouterImpl>(
      w.size(1), cfg.pmod_router_bias, cfg.router_init, cfg.router_init_seed + layer_idx + 1, w.options()));
}

RoutingMasks PModSelector::masks(const MoDDecoderLayer& layer, const ForwardState& st, int64_t B, int64_t L,
                                 at::Device device, int layer_idx, bool topk) const {
  auto m = TokenSelector::masks(layer, st, B, L, device, layer_idx, topk);
  image_tokens_routable(m, st);
  return m;
}

MoDDecoderLayer::Scores PModSelector::score(const MoDDecoderLayer& layer, const at::Tensor& h) const {
  MoDDecoderLayer::Scores s;  // TanhNorm weight; the top-k ranks by it (as the original)
  s.weight = pmod_weight(layer.cfg, layer.pmod_router->logits(h));
  s.keep_prob = s.weight;
  return s;
}

void PModSelector::capacity(const MoDDecoderLayer& layer, const at::Tensor& host_counts, const RoutingMasks& cap_masks,
                            const RoutingMasks&, bool, HostCapacity& plan, at::Tensor& k_dev) const {
  // Per-layer ratio of the image tokens (mod/pmod.h), from the host counts as well.
  plan = pmod_capacity(host_counts, layer.pmod_ratio);
  k_dev = pmod_capacity(cap_masks, layer.pmod_ratio);  // the same values on the device, without a copy
}

at::Tensor PModSelector::select(RoutingStep& s) const {
  return select_by_capacity(s, s.sc.keep_prob);  // the same top-k in training and at inference
}

at::Tensor PModSelector::skipped(RoutingStep& s) const {
  if (!s.layer.cfg.scale_by_router) return s.h;
  // Skipped image tokens leave the layer as w·x; text tokens are not scaled (weight 1 on them, also in combine).
  auto& sc = s.sc;
  const auto wi = at::where(s.masks.routable, sc.weight, at::ones_like(sc.weight));
  sc.weight = wi;
  return at::where(s.masks.routable.unsqueeze(-1), s.h * sc.weight.to(s.h.scalar_type()).unsqueeze(-1), s.h);
}

at::Tensor PModSelector::combine(const MoDConfig& cfg, const at::Tensor&, const at::Tensor& a, const at::Tensor& m,
                                 const at::Tensor& w) const {
  return combine_mlp_delta(cfg, a, m, w);
}

void PModSelector::check_convert_options(const std::string& rule, const ConvertChoices& given) const {
  if (!is_pmod_rule(rule)) throw std::invalid_argument("--rule " + rule + ": expected pmod or pmod:official_31");
  if (given.flag || given.adaptive || (given.router != default_method_name() && given.router != name()))
    throw std::invalid_argument("--rule " + rule + " sets p-MoD's router and schedule itself: drop --direct, --router "
                                "and --adaptive-threshold");
  if (given.skip_frac_given || given.forced_given)
    throw std::invalid_argument("--rule " + rule + ": p-MoD keeps each layer's ratio of the image tokens (its "
                                "schedule), so --skip-frac and --forced do not apply");
}

void PModSelector::apply_defaults(const nlohmann::json& j, MoDConfig& c) const {
  if (!j.contains("rope_positions")) c.rope_positions = RopePositions::kOriginal;
  if (!j.contains("router_init")) c.router_init = "zero";  // the official script's mod_special_init
  if (!j.contains("router_aux_loss_coef")) c.router_aux_loss_coef = 0.0;  // no routing loss
}

MoDConfig PModSelector::rule_config(const std::string& rule, int num_layers, const ConvertChoices& given) const {
  MoDConfig mc = pmod_config(num_layers, rule == "pmod" ? PModDenominator::kDepth : PModDenominator::kOfficial31);
  if (given.router_init_given) mc.router_init = given.router_init;  // else p-MoD's zero init
  mc.router_init_seed = given.router_seed;
  return mc;
}

std::optional<double> PModSelector::image_keep_ratio(const MoDConfig& cfg, int layer, int num_layers) const {
  return pmod_ratio(cfg, layer, num_layers);
}

void PModSelector::save_original_layout(const MultimodalLM& model, const MoDConfig& cfg, const std::string& out) const {
  save_pmod_original(model, cfg, out);
}

namespace {
// The original code's model type (its config.json, mod/pmod_checkpoint.h) reads as a LLaMA-family model.
const LlamaModelType original_model_type("pmod_llava_llama");
}  // namespace

GMOD_REGISTER_METHOD(pmod, PModSelector)

}  // namespace gmod

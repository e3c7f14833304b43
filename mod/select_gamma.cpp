#include "mod/select_gamma.h"

#include <stdexcept>

#include "mod/method_registry.h"
#include "model/llava.h"

namespace gmod {

namespace {
// Gamma-MOD's training capacity (capacity_rule "official_prefix"): by position in the padded row, not by role;
// also on a checkpointed layer's replay (the same masks, the same counts).
bool official_prefix(const MoDConfig& cfg, bool topk) {
  return cfg.capacity_rule == CapacityRule::kOfficialPrefix && topk;
}
}  // namespace

LayerCosts GammaSharedSelector::layer_costs(int64_t hidden) const {
  LayerCosts c;  // mod_router.weight [2, D], shared by every MoD layer (mod/router.h)
  c.shared_router_params = 2 * hidden;
  c.router_reads_normed = true;
  return c;
}

std::shared_ptr<GammaRouterImpl> GammaSharedSelector::model_router(MultimodalLM& model, const MoDConfig& cfg,
                                                                   const DenseDecoderLayer& first) const {
  const auto& w = first.self_attn->q_proj->weight;
  return model.register_module(
      "mod_router", std::make_shared<GammaRouterImpl>(w.size(1), cfg.router_init, cfg.router_init_seed, w.options()));
}

void GammaSharedSelector::attach(MoDDecoderLayer& layer, const DenseDecoderLayer&, int layer_idx) const {
  if (!layer.shared_router)
    throw std::invalid_argument("MoDDecoderLayer " + std::to_string(layer_idx) + ": γ-MoD needs the shared router");
}

std::vector<at::Tensor> GammaSharedSelector::external_parameters(const MoDDecoderLayer& layer) const {
  if (layer.shared_router) return {layer.shared_router->weight};
  return {};
}

RoutingMasks GammaSharedSelector::masks(const MoDDecoderLayer& layer, const ForwardState& st, int64_t B, int64_t L,
                                        at::Device device, int layer_idx, bool topk) const {
  auto m = TokenSelector::masks(layer, st, B, L, device, layer_idx, topk);
  if (official_prefix(layer.cfg, topk)) {
    if (st.segments)
      throw std::invalid_argument("MoD layer " + std::to_string(layer_idx) +
                                  ": capacity_rule \"official_prefix\" routes by position in the padded row, which "
                                  "packed rows do not have (train it without packing, or with capacity_rule \"roles\")");
    apply_official_prefix(m, L, layer.cfg.official_prefix);
  }
  return m;
}

MoDDecoderLayer::Scores GammaSharedSelector::score(const MoDDecoderLayer& layer, const at::Tensor& h) const {
  MoDDecoderLayer::Scores s;
  s.normed = layer.input_layernorm->forward(h);
  s.logits = layer.shared_router->logits(s.normed);  // [B, L, 2]
  s.keep_prob = at::softmax(s.logits, -1).select(-1, 1);
  s.weight = s.keep_prob;
  return s;
}

void GammaSharedSelector::capacity(const MoDDecoderLayer& layer, const at::Tensor& host_counts,
                                   const RoutingMasks& cap_masks, const RoutingMasks& masks, bool topk,
                                   HostCapacity& plan, at::Tensor& k_dev) const {
  if (official_prefix(layer.cfg, topk)) {  // positional: counted on the device, read back (a reproduction switch)
    plan = host_capacity(masks, layer.cfg.skip_frac);
    k_dev = topk_capacity(masks, layer.cfg.skip_frac);
  } else {
    TokenSelector::capacity(layer, host_counts, cap_masks, masks, topk, plan, k_dev);
  }
}

at::Tensor GammaSharedSelector::select(RoutingStep& s) const {
  return s.topk ? select_by_capacity(s, s.sc.keep_prob) : select_by_threshold(s, s.layer.cfg.infer_threshold);
}

at::Tensor GammaSharedSelector::combine(const MoDConfig& cfg, const at::Tensor&, const at::Tensor& a,
                                        const at::Tensor& m, const at::Tensor& w) const {
  return combine_mlp_delta(cfg, a, m, w);
}

GMOD_REGISTER_METHOD(gamma_shared, GammaSharedSelector)

}  // namespace gmod

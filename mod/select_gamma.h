// γ-MoD (Luo et al., "γ-MoD: Exploring Mixture-of-Depth Adaptation for Multimodal Large Language Models"; config
// router "gamma_shared"): one Linear(D->2, no bias) router shared by every MoD layer (owned by the model as
// "mod_router", on the layer's input_layernorm output); keep probability p = softmax(logits)[1]; training takes the
// capacity top-k by p with a 2-class routing CE as auxiliary loss, inference keeps a routable token when
// p > infer_threshold (adaptive thresholds: mod/routing_rule.h); the MLP delta is scaled by p. capacity_rule
// "official_prefix" reproduces the original's positional training capacity (mod_layer.h).
#pragma once

#include "mod/token_selection.h"

namespace gmod {

class GammaSharedSelector : public TokenSelector {
 public:
  const char* name() const override { return "gamma_shared"; }
  RouterKind kind() const override { return RouterKind::kGammaShared; }
  const char* display_name() const override { return "γ-MoD"; }
  bool official_prefix_capacity() const override { return true; }
  bool has_thresholds() const override { return true; }
  LayerCosts layer_costs(int64_t hidden) const override;
  std::shared_ptr<GammaRouterImpl> model_router(MultimodalLM& model, const MoDConfig& cfg,
                                                const DenseDecoderLayer& first) const override;
  void attach(MoDDecoderLayer& layer, const DenseDecoderLayer& dense, int layer_idx) const override;
  std::vector<at::Tensor> external_parameters(const MoDDecoderLayer& layer) const override;
  RoutingMasks masks(const MoDDecoderLayer& layer, const ForwardState& st, int64_t B, int64_t L, at::Device device,
                     int layer_idx, bool topk) const override;
  MoDDecoderLayer::Scores score(const MoDDecoderLayer& layer, const at::Tensor& h) const override;
  void capacity(const MoDDecoderLayer& layer, const at::Tensor& host_counts, const RoutingMasks& cap_masks,
                const RoutingMasks& masks, bool topk, HostCapacity& plan, at::Tensor& k_dev) const override;
  at::Tensor select(RoutingStep& s) const override;
  at::Tensor combine(const MoDConfig& cfg, const at::Tensor& x, const at::Tensor& a, const at::Tensor& m,
                     const at::Tensor& w) const override;
};

}  // namespace gmod

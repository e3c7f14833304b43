// The per-layer router of Raposo et al. ("Mixture-of-Depths", config router "per_layer"): Linear(D->1, no bias) per
// MoD layer on the block input gives r; training takes the capacity top-k by sigmoid(r) with BCE-with-logits on r
// as auxiliary loss, inference keeps a routable token when sigmoid(r) > decode_threshold (adaptive thresholds:
// mod/routing_rule.h); the whole block delta is scaled by r.
#pragma once

#include "mod/token_selection.h"

namespace gmod {

class PerLayerSelector : public TokenSelector {
 public:
  const char* name() const override { return "per_layer"; }
  RouterKind kind() const override { return RouterKind::kPerLayer; }
  const char* display_name() const override { return "per-layer MoD"; }
  bool has_thresholds() const override { return true; }
  LayerCosts layer_costs(int64_t hidden) const override {
    LayerCosts c;  // llm.layers.{i}.router.weight [1, D]
    c.layer_router_params = hidden;
    return c;
  }
  void attach(MoDDecoderLayer& layer, const DenseDecoderLayer& dense, int layer_idx) const override;
  MoDDecoderLayer::Scores score(const MoDDecoderLayer& layer, const at::Tensor& h) const override;
  at::Tensor select(RoutingStep& s) const override;
};

}  // namespace gmod

#include "mod/select_per_layer.h"

#include "mod/method_registry.h"

namespace gmod {

void PerLayerSelector::attach(MoDDecoderLayer& layer, const DenseDecoderLayer& d, int layer_idx) const {
  const auto& cfg = layer.cfg;
  const auto& w = d.self_attn->q_proj->weight;
  layer.router = layer.register_router(std::make_shared<ScalarRouterImpl>(
      w.size(1), cfg.router_init, cfg.router_init_seed + layer_idx + 1, w.options()));
}

MoDDecoderLayer::Scores PerLayerSelector::score(const MoDDecoderLayer& layer, const at::Tensor& h) const {
  MoDDecoderLayer::Scores s;
  auto r = layer.router->score(h);                   // [B, L]
  s.logits = at::stack({at::zeros_like(r), r}, -1);  // CE on [0, r] == BCE-with-logits on r
  s.keep_prob = at::sigmoid(r);
  s.weight = r;
  return s;
}

at::Tensor PerLayerSelector::select(RoutingStep& s) const {
  return s.topk ? select_by_capacity(s, s.sc.keep_prob) : select_by_threshold(s, s.layer.cfg.decode_threshold);
}

GMOD_REGISTER_METHOD(per_layer, PerLayerSelector)

}  // namespace gmod

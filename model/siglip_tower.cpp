#include "model/siglip_tower.h"

namespace gmod {

SiglipTower::SiglipTower(const ClipVisionConfig& c, int feature_layer, const std::string& select_strategy)
    : feature_layer_(feature_layer), keep_first_(select_strategy == "full") {
  siglip = register_module("vision_model", std::make_shared<SiglipVisionTransformer>(c));
}

at::Tensor SiglipTower::features(const at::Tensor& pixel_values) {
  siglip->checkpoint_layers = checkpoint_units_;
  auto h = siglip->forward(pixel_values, feature_layer_);  // [N, P, Dv]
  return keep_first_ ? h : h.narrow(1, 1, h.size(1) - 1);
}

}  // namespace gmod

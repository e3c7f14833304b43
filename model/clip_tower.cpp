#include "model/clip_tower.h"

namespace gmod {

ClipTower::ClipTower(const ClipVisionConfig& c, int feature_layer, const std::string& select_strategy)
    : feature_layer_(feature_layer), keep_class_(select_strategy == "full") {
  clip = register_module("vision_model", std::make_shared<ClipVisionTower>(c));
}

at::Tensor ClipTower::features(const at::Tensor& pixel_values) {
  clip->checkpoint_layers = checkpoint_units_;
  auto h = clip->forward(pixel_values, feature_layer_);  // [N, 1 + P, Dv]
  return keep_class_ ? h : h.narrow(1, 1, h.size(1) - 1);
}

}  // namespace gmod

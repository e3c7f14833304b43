// LLaVA-1.5's vision tower: one CLIP vision transformer (model/clip.h) read at the hidden state of
// `vision_feature_layer`, without (strategy "default") or with ("full") its class token. Parameters:
// vision_model.* in transformers' CLIPVisionModel names; checkpoint unit: one encoder layer.
#pragma once

#include "model/clip.h"
#include "model/vision_tower.h"

namespace gmod {

class ClipTower : public VisionTower {
 public:
  ClipTower(const ClipVisionConfig& c, int feature_layer, const std::string& select_strategy);
  at::Tensor features(const at::Tensor& pixel_values) override;
  int64_t feature_dim() const override { return clip->config.hidden_size; }
  int64_t tokens_per_image() const override { return clip->config.num_patches() + (keep_class_ ? 1 : 0); }
  int image_size() const override { return clip->config.image_size; }

  std::shared_ptr<ClipVisionTower> clip;

 private:
  int feature_layer_;
  bool keep_class_;
};

}  // namespace gmod

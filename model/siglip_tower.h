// LLaVA's vision tower on SigLIP (LLaVA-OneVision's siglip-so400m-patch14-384, or transformers'
// LlavaForConditionalGeneration with a SigLIP vision_config): one SigLIP vision transformer (model/siglip.h) read
// at the hidden state of `vision_feature_layer` (before post_layernorm, as transformers' LLaVA reads
// hidden_states), all of it (strategy "full", OneVision's) or without its first token ("default": transformers
// drops token 0 whatever the tower, for SigLIP a patch). Parameters: vision_model.* in SiglipVisionModel's names;
// checkpoint and ZeRO-3 unit: one encoder layer.
#pragma once

#include "model/siglip.h"
#include "model/vision_tower.h"

namespace gmod {

class SiglipTower : public VisionTower {
 public:
  SiglipTower(const ClipVisionConfig& c, int feature_layer, const std::string& select_strategy);
  at::Tensor features(const at::Tensor& pixel_values) override;
  int64_t feature_dim() const override { return siglip->config.hidden_size; }
  int64_t tokens_per_image() const override { return siglip->config.num_patches() - (keep_first_ ? 0 : 1); }
  int image_size() const override { return siglip->config.image_size; }

  std::shared_ptr<SiglipVisionTransformer> siglip;

 private:
  int feature_layer_;
  bool keep_first_;
};

}  // namespace gmod

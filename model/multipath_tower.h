// LLaVA-HR's multipath vision tower (MultiPathCLIPVisionTower of multipath_encoder_wapper.py) behind the
// VisionTower interface. For an image of side S = input_image_size:
//   fast path: the image resized bilinearly (align_corners=True) to F = max(S/32*14, 336) px, CLIP patch +
//              position embeddings (the position table resampled to the F/patch grid, bicubic antialias), the
//              class token dropped, pre_layrnorm, then ALL encoder layers in four quarters (the config's
//              mm_vision_select_layer is not used by this path, as in the original; no post_layernorm);
//   slow path: ConvNeXt (model/convnext.h) at S px -> [N, C, S/32, S/32];
//   after quarters 1..3 a stitch adapter mixes the slow map into the fast tokens (only when the towers
//   train, freeze_vision false), and the align adapter merges both into [N, (F/patch)^2, D_clip].
// Parameter names mirror the original module tree without its inner `.vision_tower` levels:
//   fast_vision_tower.vision_model.*, slow_vision_tower.{stem,stages}.*, align_stages_latent.{0,1,2}.*,
//   align_stages.0.*. Checkpoint units: each CLIP encoder layer and each ConvNeXt stage.
#pragma once

#include "model/clip.h"
#include "model/convnext.h"
#include "model/mr_adapters.h"
#include "model/vision_tower.h"

namespace gmod {

class MultipathTower : public VisionTower {
 public:
  MultipathTower(const ClipVisionConfig& fast, const MultipathConfig& m);
  at::Tensor features(const at::Tensor& pixel_values) override;
  int64_t feature_dim() const override { return clip->config.hidden_size; }
  int64_t tokens_per_image() const override;
  int image_size() const override { return config.input_image_size; }
  bool init_parameter(const std::string& name, at::Tensor& t, at::Generator& gen) const override;
  std::string differentiated_bilinear_resize() const override;
  bool is_adapter(const std::string& name) const override { return name.rfind("align_stages", 0) == 0; }

  MultipathConfig config;
  std::shared_ptr<ClipVisionTower> clip;
  std::shared_ptr<ConvNext> convnext;
  std::vector<std::shared_ptr<StitchAdapter>> stitches;  // empty when the towers are frozen
  std::shared_ptr<AlignAdapter> align;
};

}  // namespace gmod

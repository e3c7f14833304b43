// Mini-Gemini's (MGM) two-path vision tower behind the VisionTower interface:
// MGMMetaForCausalLM.encode_images of mgm_arch.py with its CLIPVisionTower and OpenCLIPVisionTower, plus the
// low-resolution crops MGM's dataset cuts from the high-resolution image. For normalised pixels [N, 3, A, A]
// (A = image_size_aux):
//   low-resolution path: the image resized bilinearly (align_corners=False, fp32) to G*S px (S = CLIP's image
//     size, G = image_grid), cut into G x G crops of S px (row-major), plus with image_global the G*S image
//     resized again to S px; CLIP on every crop, hidden state of mm_vision_select_layer, class token dropped;
//   high-resolution path: ConvNeXt (model/convnext.h) at A px; every stage's map resized bilinearly to the
//   stem's
//     grid A/4 and concatenated along channels (sum of the stage widths);
//   patch info mining (model/patch_info_mining.h): each crop's tokens mine its part of the map (the global
//     crop the whole map resized to A/4/G), and the mined features are added to the tokens;
//   output [N, (G*G + global) * (S/patch)^2, D_clip], the global crop's tokens first.
// Parameter names: vision_model.* (CLIP, transformers' names), vision_tower_aux.{stem,stages}.* (timm's
// names), mining.vlm_uni_{query,aux,val}_projector.*. Trained with frozen towers: the mining projectors
// always, the second half of the CLIP layers with optimize_vision_tower, the last block of each ConvNeXt
// stage with optimize_vision_tower_aux (is_adapter). Checkpoint units: each CLIP encoder layer and each
// ConvNeXt stage.
#pragma once

#include "model/clip.h"
#include "model/convnext.h"
#include "model/patch_info_mining.h"
#include "model/vision_tower.h"

namespace gmod {

class MgmTower : public VisionTower {
 public:
  MgmTower(const ClipVisionConfig& clip_config, int feature_layer, const MgmConfig& m);
  at::Tensor features(const at::Tensor& pixel_values) override;
  int64_t feature_dim() const override { return clip->config.hidden_size; }
  int64_t tokens_per_image() const override {
    return int64_t(clip->config.num_patches()) * config.clip_images();
  }
  int image_size() const override { return config.image_size_aux; }
  bool init_parameter(const std::string& name, at::Tensor& t, at::Generator& gen) const override;
  std::string differentiated_bilinear_resize() const override;
  bool is_adapter(const std::string& name) const override;

  // The ConvNeXt stage maps resized to the stem's grid and concatenated: [N, sum(dims), A/4, A/4].
  at::Tensor aux_features(const at::Tensor& pixels);

  MgmConfig config;
  std::shared_ptr<ClipVisionTower> clip;
  std::shared_ptr<ConvNext> convnext;
  std::shared_ptr<PatchInfoMining> mining;

 private:
  int feature_layer_;
};

}  // namespace gmod

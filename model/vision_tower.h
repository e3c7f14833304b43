// The vision tower interface: all that the LLM side (MultimodalLM, projector, MoD, trainer, checkpoint code)
// knows of the tower that turns images into patch features. Implementations: the CLIP tower of LLaVA-1.5
// (model/clip_tower.h), LLaVA-OneVision's SigLIP tower (model/siglip_tower.h), LLaVA-HR's CLIP + ConvNeXt
// multipath tower (model/multipath_tower.h), Mini-Gemini's CLIP + ConvNeXt tower with patch info mining
// (model/mgm_tower.h) and Qwen2.5-VL's encoder of variable patch grids (model/qwen2_5_vl_vision.h), chosen by the
// model config in make_vision_tower. A tower registers its parameters under its own names; MultimodalLM puts it
// at `vision.`, and each tower's checkpoint names are mapped in model/hf_names.cpp.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/config.h"

namespace gmod {

class VisionTower : public torch::nn::Module {
 public:
  // Normalised pixels [N, C, S, S] (S = image_size()) -> patch features [N, tokens_per_image(),
  // feature_dim()] in the tower's parameter dtype; these are what the projector maps.
  virtual at::Tensor features(const at::Tensor& pixel_values) = 0;
  // The features of every image of a batch, one row per LLM image-token position in the order they occur:
  // [sum of tokens, feature_dim()]. `grid_thw` [N_images, 3] gives each image's patch grid for towers of variable
  // grids (pixel_values then holds the images' patches, [N_patches, patch_dim]); fixed-size towers take no grid and
  // return features() flattened.
  virtual at::Tensor token_features(const at::Tensor& pixel_values, const at::Tensor& grid_thw) {
    if (grid_thw.defined()) throw std::invalid_argument("this vision tower takes square images, not grid_thw");
    auto f = features(pixel_values);
    return f.reshape({-1, f.size(-1)});
  }
  // token_features() plus, for DeepStack towers (Qwen3-VL, model/qwen3_vl_vision.h), one tensor of the same shape
  // per DeepStack level appended to `deepstack`: what MultimodalLM adds to its first LLM layers' hidden states at
  // the image positions (ForwardState::deepstack). Other towers append nothing.
  virtual at::Tensor token_features_stacked(const at::Tensor& pixel_values, const at::Tensor& grid_thw,
                                            std::vector<at::Tensor>& deepstack) {
    (void)deepstack;
    return token_features(pixel_values, grid_thw);
  }
  virtual int64_t feature_dim() const = 0;
  // Tokens per image; 0 when it varies with the image (grid_thw).
  virtual int64_t tokens_per_image() const = 0;
  // The side of the square images preprocessing must produce; 0 when the tower takes any patch grid.
  virtual int image_size() const = 0;
  // True when the features already have the LLM's width (Qwen2.5-VL's merger): the model has no projector.
  virtual bool projects_to_text() const { return false; }
  // Random initialisation of one parameter as the original model initialises it (`name` relative to the
  // tower). Returns false to leave it to MultimodalLM's default (normal(0, initializer_range), norms 1,
  // biases 0), which draws from `gen` in parameter order.
  virtual bool init_parameter(const std::string& name, at::Tensor& t, at::Generator& gen) const {
    (void)name, (void)t, (void)gen;
    return false;
  }
  // True for adapter parameters (`name` relative to the tower) that train even when the tower is frozen, as
  // LLaVA-HR trains its align module with frozen towers.
  virtual bool is_adapter(const std::string& name) const {
    (void)name;
    return false;
  }
  // Where the forward resizes bilinearly a tensor that requires grad with the parameters' current requires_grad
  // flags (so the resize's backward runs), or "" when none does. That backward has no deterministic CUDA kernel in
  // LibTorch; the trainer refuses `deterministic: true` on CUDA for such a run at start (trainer/deterministic_check.h).
  virtual std::string differentiated_bilinear_resize() const { return ""; }
  // Recompute the tower's checkpoint units (CLIP encoder layers, ConvNeXt stages) in the backward instead of
  // keeping their activations.
  void set_activation_checkpointing(bool on) { checkpoint_units_ = on; }
  bool activation_checkpointing() const { return checkpoint_units_; }

 protected:
  bool checkpoint_units_ = false;
};

// The tower the config asks for; nullptr for a text-only model (no vision config).
std::shared_ptr<VisionTower> make_vision_tower(const LlavaConfig& c);

}  // namespace gmod

// CLIP vision transformer in the transformers `CLIPVisionModel` layout (patch + class + position
// embeddings, pre-layernorm, pre-norm encoder layers with quick_gelu MLP). LLaVA reads the hidden
// state of one encoder layer, so only the layers up to it are run. The VisionTower wrappers around it are
// model/clip_tower.h (LLaVA-1.5) and model/multipath_tower.h (LLaVA-HR's fast path, which also feeds it
// larger images than its position table covers, see embed()).
#pragma once

#include "model/layers.h"

namespace gmod {

class LayerNormImpl : public torch::nn::Module {
 public:
  LayerNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x) const {
    return at::layer_norm(x, {weight.size(0)}, weight, bias, eps);
  }
  at::Tensor weight, bias;
  double eps;
};

class ClipEncoderLayer : public torch::nn::Module {
 public:
  explicit ClipEncoderLayer(const ClipVisionConfig& c);
  at::Tensor forward(const at::Tensor& x);  // [N, T, D]

  std::shared_ptr<torch::nn::Module> self_attn, mlp;
  std::shared_ptr<LinearImpl> q_proj, k_proj, v_proj, out_proj, fc1, fc2;
  std::shared_ptr<LayerNormImpl> layer_norm1, layer_norm2;
  int64_t n_heads, head_dim;
  // The MLP's activation, config hidden_act: CLIP's quick_gelu (x * sigmoid(1.702 x)), exact gelu, or SigLIP's
  // gelu_pytorch_tanh (the tanh approximation); SigLIP's encoder layer is otherwise this one (model/siglip.h).
  enum class Act { kQuickGelu, kGelu, kGeluTanh } act;
};

class ClipVisionTower : public torch::nn::Module {
 public:
  explicit ClipVisionTower(const ClipVisionConfig& c);
  // pixel_values [N, C, S, S] -> hidden_states[feature_layer] [N, 1 + patches, D], where index 0 is
  // the embedding output (after pre_layrnorm) and negative indices count from the end, as in HF.
  at::Tensor forward(const at::Tensor& pixel_values, int feature_layer);
  // Class + patch + position embeddings [N, 1 + g*g, D] (before pre_layrnorm) for pixels of any side S,
  // g = S / patch_size. When g is not the config's grid, the position table is resampled as LLaVA-HR's
  // resample_pos_embed does: patch positions bicubic with antialias (in fp32), the class position kept.
  at::Tensor embed(const at::Tensor& pixel_values) const;
  // Encoder layer i; recomputed in the backward instead of keeping its activations when checkpoint_layers.
  at::Tensor run_layer(int i, const at::Tensor& h);

  ClipVisionConfig config;
  bool checkpoint_layers = false;
  at::Tensor class_embedding, patch_embedding, position_embedding;
  std::shared_ptr<LayerNormImpl> pre_layrnorm, post_layernorm;
  std::vector<std::shared_ptr<ClipEncoderLayer>> layers;
};

}  // namespace gmod

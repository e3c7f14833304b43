// SigLIP vision transformer in the transformers `SiglipVisionModel` layout, as LLaVA-OneVision's
// siglip-so400m-patch14-384 tower: a patch conv with bias, learned position embeddings (one per patch: no class
// token, no class position), no pre-layernorm, pre-norm encoder layers with a gelu_pytorch_tanh MLP (the same
// layer layout and names as CLIP's, model/clip.h, so the ZeRO-3 units and checkpoint units are CLIP's), and
// post_layernorm. The attention-pooling head is not held: LLaVA reads an encoder hidden state and never runs it
// (model/hf_names.cpp lists a checkpoint's head as unused). The VisionTower around it is model/siglip_tower.h.
#pragma once

#include "model/clip.h"

namespace gmod {

class SiglipVisionTransformer : public torch::nn::Module {
 public:
  explicit SiglipVisionTransformer(const ClipVisionConfig& c);
  // pixel_values [N, C, S, S] -> hidden_states[feature_layer] [N, patches, D]: index 0 is the embedding output,
  // i the output of encoder layer i - 1, negative indices count from the end (-1: the last layer, before
  // post_layernorm), as transformers' output_hidden_states. Only the layers up to it are run.
  at::Tensor forward(const at::Tensor& pixel_values, int feature_layer);
  // SiglipVisionModel's last_hidden_state: every layer, then post_layernorm [N, patches, D].
  at::Tensor last_hidden_state(const at::Tensor& pixel_values);
  // Patch + position embeddings [N, g*g, D]; S must be the config's image_size (LLaVA never interpolates them).
  at::Tensor embed(const at::Tensor& pixel_values) const;
  // Encoder layer i; recomputed in the backward instead of keeping its activations when checkpoint_layers.
  at::Tensor run_layer(int i, const at::Tensor& h);

  ClipVisionConfig config;
  bool checkpoint_layers = false;
  at::Tensor patch_embedding, patch_bias, position_embedding;
  std::shared_ptr<LayerNormImpl> post_layernorm;
  std::vector<std::shared_ptr<ClipEncoderLayer>> layers;
};

}  // namespace gmod

#include "model/siglip.h"

#include <stdexcept>
#include <string>

#include "model/module_group.h"
#include "model/unit_checkpoint.h"
#include "model/unit_hooks.h"

namespace gmod {

SiglipVisionTransformer::SiglipVisionTransformer(const ClipVisionConfig& c) : config(c) {
  if (!c.siglip()) throw std::invalid_argument("SigLIP tower built from a '" + c.model_type + "' vision config");
  auto emb = register_module("embeddings", std::make_shared<ModuleGroup>());
  auto patch = emb->register_module("patch_embedding", std::make_shared<ModuleGroup>());
  patch_embedding = patch->register_parameter(
      "weight", at::empty({c.hidden_size, c.num_channels, c.patch_size, c.patch_size}));
  patch_bias = patch->register_parameter("bias", at::zeros({c.hidden_size}));
  auto pos = emb->register_module("position_embedding", std::make_shared<ModuleGroup>());
  position_embedding = pos->register_parameter("weight", at::empty({c.num_patches(), c.hidden_size}));
  auto enc = register_module("encoder", std::make_shared<ModuleGroup>());
  auto list = enc->register_module("layers", std::make_shared<ModuleGroup>());
  for (int i = 0; i < c.num_hidden_layers; ++i)
    layers.push_back(list->register_module(std::to_string(i), std::make_shared<ClipEncoderLayer>(c)));
  post_layernorm = register_module("post_layernorm", std::make_shared<LayerNormImpl>(c.hidden_size, c.layer_norm_eps));
}

at::Tensor SiglipVisionTransformer::embed(const at::Tensor& pixel_values) const {
  if (pixel_values.dim() != 4 || pixel_values.size(2) != config.image_size ||
      pixel_values.size(3) != config.image_size)
    throw std::invalid_argument("SigLIP: pixel_values must be [N, C, " + std::to_string(config.image_size) + ", " +
                                std::to_string(config.image_size) + "], got " + std::to_string(pixel_values.dim()) +
                                "-d " + (pixel_values.dim() == 4 ? std::to_string(pixel_values.size(2)) + "x" +
                                                                       std::to_string(pixel_values.size(3))
                                                                 : std::string("tensor")));
  auto px = pixel_values.to(patch_embedding.scalar_type());
  auto patches = at::conv2d(px, patch_embedding, patch_bias, config.patch_size);  // [N, D, g, g]
  return patches.flatten(2).transpose(1, 2) + position_embedding.unsqueeze(0);  // [N, g*g, D]
}

at::Tensor SiglipVisionTransformer::run_layer(int i, const at::Tensor& h) {
  auto layer = layers.at(i);
  return run_unit(*layer, [&] {
    if (!checkpoint_layers) return layer->forward(h);
    return checkpointed_unit([layer](const at::Tensor& x) { return layer->forward(x); }, h, layer->parameters(),
                             "SigLIP encoder layer " + std::to_string(i));
  });
}

at::Tensor SiglipVisionTransformer::forward(const at::Tensor& pixel_values, int feature_layer) {
  const int n = config.num_hidden_layers;
  const int run = feature_layer >= 0 ? feature_layer : n + 1 + feature_layer;
  if (run < 0 || run > n)
    throw std::invalid_argument("SigLIP: vision feature layer " + std::to_string(feature_layer) +
                                " out of range for " + std::to_string(n) + " layers");
  auto h = embed(pixel_values);
  for (int i = 0; i < run; ++i) h = run_layer(i, h);
  return h;
}

at::Tensor SiglipVisionTransformer::last_hidden_state(const at::Tensor& pixel_values) {
  return post_layernorm->forward(forward(pixel_values, -1));
}

}  // namespace gmod

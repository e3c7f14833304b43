#include "model/clip.h"

#include <cmath>

#include "model/module_group.h"
#include "model/unit_checkpoint.h"
#include "model/unit_hooks.h"

namespace gmod {

LayerNormImpl::LayerNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", at::ones({dim}));
  bias = register_parameter("bias", at::zeros({dim}));
}

ClipEncoderLayer::ClipEncoderLayer(const ClipVisionConfig& c)
    : n_heads(c.num_attention_heads), head_dim(c.hidden_size / c.num_attention_heads),
      act(c.hidden_act == "quick_gelu" ? Act::kQuickGelu
          : c.hidden_act == "gelu_pytorch_tanh" ? Act::kGeluTanh
                                                : Act::kGelu) {
  const int64_t d = c.hidden_size;
  self_attn = register_module("self_attn", std::make_shared<ModuleGroup>());
  q_proj = self_attn->register_module("q_proj", std::make_shared<LinearImpl>(d, d, true));
  k_proj = self_attn->register_module("k_proj", std::make_shared<LinearImpl>(d, d, true));
  v_proj = self_attn->register_module("v_proj", std::make_shared<LinearImpl>(d, d, true));
  out_proj = self_attn->register_module("out_proj", std::make_shared<LinearImpl>(d, d, true));
  layer_norm1 = register_module("layer_norm1", std::make_shared<LayerNormImpl>(d, c.layer_norm_eps));
  mlp = register_module("mlp", std::make_shared<ModuleGroup>());
  fc1 = mlp->register_module("fc1", std::make_shared<LinearImpl>(d, c.intermediate_size, true));
  fc2 = mlp->register_module("fc2", std::make_shared<LinearImpl>(c.intermediate_size, d, true));
  layer_norm2 = register_module("layer_norm2", std::make_shared<LayerNormImpl>(d, c.layer_norm_eps));
}

at::Tensor ClipEncoderLayer::forward(const at::Tensor& x) {
  auto N = x.size(0), T = x.size(1), D = x.size(2);
  auto h = layer_norm1->forward(x);
  auto split = [&](const at::Tensor& t) { return t.view({N, T, n_heads, head_dim}).transpose(1, 2); };
  auto q = split(q_proj->forward(h)), k = split(k_proj->forward(h)), v = split(v_proj->forward(h));
  auto a = at::scaled_dot_product_attention(q, k, v, {}, 0.0, false, 1.0 / std::sqrt(double(head_dim)));
  auto y = x + out_proj->forward(a.transpose(1, 2).reshape({N, T, D}));
  auto m = fc1->forward(layer_norm2->forward(y));
  m = act == Act::kQuickGelu ? m * at::sigmoid(1.702 * m) : at::gelu(m, act == Act::kGeluTanh ? "tanh" : "none");
  return y + fc2->forward(m);
}

ClipVisionTower::ClipVisionTower(const ClipVisionConfig& c) : config(c) {
  auto emb = register_module("embeddings", std::make_shared<ModuleGroup>());
  class_embedding = emb->register_parameter("class_embedding", at::empty({c.hidden_size}));
  auto patch = emb->register_module("patch_embedding", std::make_shared<ModuleGroup>());
  patch_embedding = patch->register_parameter(
      "weight", at::empty({c.hidden_size, c.num_channels, c.patch_size, c.patch_size}));
  auto pos = emb->register_module("position_embedding", std::make_shared<ModuleGroup>());
  position_embedding = pos->register_parameter("weight", at::empty({c.num_patches() + 1, c.hidden_size}));
  pre_layrnorm = register_module("pre_layrnorm", std::make_shared<LayerNormImpl>(c.hidden_size, c.layer_norm_eps));
  auto enc = register_module("encoder", std::make_shared<ModuleGroup>());
  auto list = enc->register_module("layers", std::make_shared<ModuleGroup>());
  for (int i = 0; i < c.num_hidden_layers; ++i)
    layers.push_back(list->register_module(std::to_string(i), std::make_shared<ClipEncoderLayer>(c)));
  post_layernorm = register_module("post_layernorm", std::make_shared<LayerNormImpl>(c.hidden_size, c.layer_norm_eps));
}

at::Tensor ClipVisionTower::embed(const at::Tensor& pixel_values) const {
  auto px = pixel_values.to(patch_embedding.scalar_type());
  auto patches = at::conv2d(px, patch_embedding, {}, config.patch_size);  // [N, D, g, g]
  const int64_t gh = patches.size(2), gw = patches.size(3);
  patches = patches.flatten(2).transpose(1, 2);  // [N, g*g, D]
  auto cls = class_embedding.view({1, 1, -1}).expand({px.size(0), 1, class_embedding.size(0)});
  auto pos = position_embedding.unsqueeze(0);  // [1, 1 + G*G, D]
  if (gh * gw + 1 != pos.size(1)) {
    if (gh != gw) throw std::invalid_argument("CLIP: position resampling needs a square patch grid");
    const int64_t G = config.image_size / config.patch_size, D = pos.size(2);
    auto grid = pos.narrow(1, 1, G * G).to(at::kFloat).reshape({1, G, G, D}).permute({0, 3, 1, 2});
    grid = at::_upsample_bicubic2d_aa(grid, {gh, gw}, /*align_corners=*/false, std::nullopt, std::nullopt);
    grid = grid.permute({0, 2, 3, 1}).reshape({1, gh * gw, D}).to(pos.scalar_type());
    pos = at::cat({pos.narrow(1, 0, 1), grid}, 1);
  }
  return at::cat({cls, patches}, 1) + pos;
}

at::Tensor ClipVisionTower::run_layer(int i, const at::Tensor& h) {
  auto layer = layers.at(i);
  return run_unit(*layer, [&] {
    if (!checkpoint_layers) return layer->forward(h);
    return checkpointed_unit([layer](const at::Tensor& x) { return layer->forward(x); }, h, layer->parameters(),
                             "CLIP encoder layer " + std::to_string(i));
  });
}

at::Tensor ClipVisionTower::forward(const at::Tensor& pixel_values, int feature_layer) {
  const int n = config.num_hidden_layers;
  const int run = feature_layer >= 0 ? feature_layer : n + 1 + feature_layer;
  if (run < 0 || run > n) throw std::invalid_argument("vision feature layer out of range");
  auto h = pre_layrnorm->forward(embed(pixel_values));
  for (int i = 0; i < run; ++i) h = run_layer(i, h);
  return h;
}

}  // namespace gmod

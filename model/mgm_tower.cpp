#include "model/mgm_tower.h"

#include <cmath>

#include "model/strings.h"

namespace gmod {
namespace {

// F.interpolate(x.float(), size, mode='bilinear', align_corners=False) cast back to x's dtype.
at::Tensor resize(const at::Tensor& x, int64_t side) {
  return at::upsample_bilinear2d(x.to(at::kFloat), {side, side}, /*align_corners=*/false).to(x.scalar_type());
}

}  // namespace

MgmTower::MgmTower(const ClipVisionConfig& clip_config, int feature_layer, const MgmConfig& m)
    : config(m), feature_layer_(feature_layer) {
  clip = register_module("vision_model", std::make_shared<ClipVisionTower>(clip_config));
  convnext = register_module("vision_tower_aux", std::make_shared<ConvNext>(m.aux));
  mining =
      register_module("mining", std::make_shared<PatchInfoMining>(clip_config.hidden_size, m.aux_channels()));
}

at::Tensor MgmTower::aux_features(const at::Tensor& pixels) {
  auto h = convnext->stem(pixels);
  std::vector<at::Tensor> maps;
  for (int i = 0; i < 4; ++i) {
    h = convnext->run_stage(i, h);
    maps.push_back(h);
  }
  const int64_t s0 = maps[0].size(-1);
  for (int i = 1; i < 4; ++i) maps[i] = resize(maps[i], s0);
  return at::cat(maps, 1);
}

at::Tensor MgmTower::features(const at::Tensor& pixel_values) {
  const int A = config.image_size_aux, S = clip->config.image_size, G = config.image_grid;
  if (pixel_values.dim() != 4 || pixel_values.size(1) != clip->config.num_channels ||
      pixel_values.size(2) != A || pixel_values.size(3) != A)
    throw std::invalid_argument("MGM tower: expected pixels [N, " +
                                std::to_string(clip->config.num_channels) + ", " + std::to_string(A) + ", " +
                                std::to_string(A) + "], got " + std::string(c10::str(pixel_values.sizes())));
  clip->checkpoint_layers = checkpoint_units_;
  convnext->checkpoint_stages = checkpoint_units_;
  const auto dtype = clip->patch_embedding.scalar_type();
  const int64_t N = pixel_values.size(0), C = pixel_values.size(1);

  // The low-resolution crops, cut in fp32 as MGM's dataset cuts them from the normalised aux image.
  const auto low =
      at::upsample_bilinear2d(pixel_values.to(at::kFloat), {int64_t(G) * S, int64_t(G) * S}, false);
  auto crops = low.reshape({N, C, G, S, G, S}).permute({0, 2, 4, 1, 3, 5}).reshape({N * G * G, C, S, S});
  if (config.image_global) crops = at::cat({crops, at::upsample_bilinear2d(low, {S, S}, false)});
  auto tokens = clip->forward(crops.to(dtype), feature_layer_);
  tokens = tokens.narrow(1, 1, tokens.size(1) - 1);  // [crops, T, D]
  const int64_t T = tokens.size(1), D = tokens.size(2);

  const auto aux =
      aux_features(pixel_values.to(convnext->stem_conv_weight.scalar_type())).to(tokens.scalar_type());
  const int64_t s0 = aux.size(-1), Ca = aux.size(1), cell = s0 / G;
  auto grid_tokens = tokens.narrow(0, 0, N * G * G);
  auto regions =
      aux.reshape({N, Ca, G, cell, G, cell}).permute({0, 2, 4, 1, 3, 5}).reshape({N * G * G, Ca, cell, cell});
  auto out = (grid_tokens + mining->forward(grid_tokens, regions)).reshape({N, G * G * T, D});
  if (config.image_global) {
    // F.interpolate(scale_factor=1/G): the output side floor(s0 * (1/G)) and the scale 1/G itself.
    const double scale = 1.0 / G;
    const auto side = static_cast<int64_t>(std::floor(double(s0) * scale));
    const auto aux_global =
        at::upsample_bilinear2d(aux.to(at::kFloat), {side, side}, false, scale, scale).to(aux.scalar_type());
    auto global_tokens = tokens.narrow(0, N * G * G, N);
    out = at::cat({global_tokens + mining->forward(global_tokens, aux_global), out}, 1);
  }
  return out;
}

bool MgmTower::is_adapter(const std::string& name) const {
  if (starts_with(name, "mining.")) return true;
  if (config.optimize_vision_tower_aux)  // MGM trains the last block of every ConvNeXt stage
    for (size_t i = 0; i < config.aux.depths.size(); ++i)
      if (starts_with(name, "vision_tower_aux.stages." + std::to_string(i) + ".blocks." +
                                std::to_string(config.aux.depths[i] - 1) + "."))
        return true;
  if (config.optimize_vision_tower) {  // and the second half of the CLIP encoder layers
    const std::string pre = "vision_model.encoder.layers.";
    if (starts_with(name, pre)) {
      const int layer = std::atoi(name.c_str() + pre.size());
      return layer >= clip->config.num_hidden_layers / 2;
    }
  }
  return false;
}

bool MgmTower::init_parameter(const std::string& name, at::Tensor& t, at::Generator& gen) const {
  if (starts_with(name, "vision_tower_aux.")) {  // timm's _init_weights
    init_convnext_parameter(name.substr(17), t, gen, config.aux);
    return true;
  }
  if (starts_with(name, "mining.")) {  // built after loading: nn.LayerNorm / nn.Linear defaults
    if (name.find(".0.") != std::string::npos) {
      t.fill_(name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0 ? 1.0 : 0.0);
    } else {
      const auto fan_in =
          double(name.find("query") != std::string::npos ? clip->config.hidden_size : config.aux_channels());
      const double a = 1.0 / std::sqrt(fan_in);
      t.copy_((at::rand(t.sizes(), gen, at::TensorOptions().dtype(at::kFloat)) * 2 - 1).mul(a).to(t.dtype()));
    }
    return true;
  }
  return false;
}

std::string MgmTower::differentiated_bilinear_resize() const {
  for (const auto& t : convnext->parameters())
    if (t.requires_grad()) return "Mini-Gemini's global crop (model/mgm_tower.cpp) resizes the trained ConvNeXt's features";
  return "";
}

}  // namespace gmod

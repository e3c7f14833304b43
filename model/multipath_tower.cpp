#include "model/multipath_tower.h"

#include <cmath>

#include "model/module_group.h"
#include "model/strings.h"

namespace gmod {
namespace {}  // namespace

MultipathTower::MultipathTower(const ClipVisionConfig& fast, const MultipathConfig& m) : config(m) {
  auto f = register_module("fast_vision_tower", std::make_shared<ModuleGroup>());
  clip = f->register_module("vision_model", std::make_shared<ClipVisionTower>(fast));
  convnext = register_module("slow_vision_tower", std::make_shared<ConvNext>(m.slow));
  const int64_t d = fast.hidden_size, c = m.slow.dims.back();
  if (m.stitch) {
    auto list = register_module("align_stages_latent", std::make_shared<ModuleGroup>());
    for (int i = 0; i < 3; ++i)
      stitches.push_back(list->register_module(std::to_string(i), std::make_shared<StitchAdapter>(d, c)));
  }
  auto list = register_module("align_stages", std::make_shared<ModuleGroup>());
  align = list->register_module("0", std::make_shared<AlignAdapter>(d, c));
}

int64_t MultipathTower::tokens_per_image() const {
  const int64_t g = config.fast_image_size() / clip->config.patch_size;
  return g * g;
}

at::Tensor MultipathTower::features(const at::Tensor& pixel_values) {
  if (pixel_values.dim() != 4 || pixel_values.size(2) != config.input_image_size ||
      pixel_values.size(3) != config.input_image_size)
    throw std::invalid_argument(
        "LLaVA-HR tower: expected pixels [N, 3, " + std::to_string(config.input_image_size) + ", " +
        std::to_string(config.input_image_size) + "], got " + std::string(c10::str(pixel_values.sizes())));
  clip->checkpoint_layers = checkpoint_units_;
  convnext->checkpoint_stages = checkpoint_units_;
  const int64_t F = config.fast_image_size();
  auto x = pixel_values.to(convnext->stem_conv_weight.scalar_type());
  auto y = at::upsample_bilinear2d(x.to(at::kFloat), {F, F}, /*align_corners=*/true).to(x.scalar_type());
  y = clip->embed(y);
  y = clip->pre_layrnorm->forward(y.narrow(1, 1, y.size(1) - 1));
  auto s = convnext->forward(x);  // [N, C, S/32, S/32]
  const int n = clip->config.num_hidden_layers, q = n / 4;
  for (int part = 0; part < 4; ++part) {
    for (int i = part * q; i < (part + 1) * q; ++i) y = clip->run_layer(i, y);
    if (part < 3 && !stitches.empty()) y = stitches[part]->forward(y, s);
  }
  return align->forward(y, s);
}

bool MultipathTower::init_parameter(const std::string& name, at::Tensor& t, at::Generator& gen) const {
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  if (name.rfind("slow_vision_tower.", 0) == 0) {  // timm's _init_weights
    init_convnext_parameter(name.substr(18), t, gen, config.slow);
    return true;
  }
  if (name.rfind("align_stages_latent.", 0) == 0) {  // zero_init=True: the stitch starts as the identity
    if (ends_with(name, ".bias") || name.find("_proj.") != std::string::npos)
      t.zero_();
    else if (name.find("_conv.") != std::string::npos) {  // xavier_uniform
      const double fan_in = double(t.size(1)) * t[0][0].numel(),
                   fan_out = double(t.size(0)) * t[0][0].numel();
      const double a = std::sqrt(6.0 / (fan_in + fan_out));
      t.copy_((at::rand(t.sizes(), gen, opts) * 2 - 1).mul(a).to(t.dtype()));
    } else {
      const double a = 1.0 / std::sqrt(double(t.size(1)));  // nn.Linear's default bound
      t.copy_((at::rand(t.sizes(), gen, opts) * 2 - 1).mul(a).to(t.dtype()));
    }
    return true;
  }
  return false;
}

std::string MultipathTower::differentiated_bilinear_resize() const {
  for (const auto& t : convnext->parameters())
    if (t.requires_grad()) return "LLaVA-HR's align_grid (model/mr_adapters.cpp) upsamples the trained ConvNeXt's features";
  return "";
}

}  // namespace gmod

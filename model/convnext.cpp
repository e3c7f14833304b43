#include "model/convnext.h"

#include "model/module_group.h"
#include "model/unit_checkpoint.h"
#include "model/unit_hooks.h"

namespace gmod {
at::Tensor layer_norm_2d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  auto y = at::layer_norm(x.permute({0, 2, 3, 1}), {weight.size(0)}, weight, bias, eps);
  return y.permute({0, 3, 1, 2});
}

ConvNextBlock::ConvNextBlock(int64_t d, const ConvNextConfig& c) : eps(c.norm_eps), pad(c.kernel_size / 2) {
  const int64_t h = int64_t(c.mlp_ratio) * d;
  auto dw = register_module("conv_dw", std::make_shared<ModuleGroup>());
  dw_weight = dw->register_parameter("weight", at::empty({d, 1, c.kernel_size, c.kernel_size}));
  dw_bias = dw->register_parameter("bias", at::zeros({d}));
  auto norm = register_module("norm", std::make_shared<ModuleGroup>());
  norm_weight = norm->register_parameter("weight", at::ones({d}));
  norm_bias = norm->register_parameter("bias", at::zeros({d}));
  auto mlp = register_module("mlp", std::make_shared<ModuleGroup>());
  auto fc1 = mlp->register_module("fc1", std::make_shared<ModuleGroup>());
  fc1_weight = fc1->register_parameter("weight", at::empty({h, d}));
  fc1_bias = fc1->register_parameter("bias", at::zeros({h}));
  auto fc2 = mlp->register_module("fc2", std::make_shared<ModuleGroup>());
  fc2_weight = fc2->register_parameter("weight", at::empty({d, h}));
  fc2_bias = fc2->register_parameter("bias", at::zeros({d}));
  if (c.ls_init_value > 0) gamma = register_parameter("gamma", at::full({d}, c.ls_init_value));
}

at::Tensor ConvNextBlock::forward(const at::Tensor& x) const {
  auto y = at::conv2d(x, dw_weight, dw_bias, 1, pad, 1, x.size(1));
  y = y.permute({0, 2, 3, 1});  // NHWC
  y = at::layer_norm(y, {norm_weight.size(0)}, norm_weight, norm_bias, eps);
  y = at::linear(at::gelu(at::linear(y, fc1_weight, fc1_bias)), fc2_weight, fc2_bias);
  y = y.permute({0, 3, 1, 2});
  if (gamma.defined()) y = y.mul(gamma.reshape({1, -1, 1, 1}));
  return y + x;
}

ConvNextStage::ConvNextStage(int64_t in, int64_t out, int depth, bool downsample, const ConvNextConfig& c)
    : eps(c.norm_eps) {
  if (downsample) {
    auto ds = register_module("downsample", std::make_shared<ModuleGroup>());
    auto n = ds->register_module("0", std::make_shared<ModuleGroup>());
    ds_norm_weight = n->register_parameter("weight", at::ones({in}));
    ds_norm_bias = n->register_parameter("bias", at::zeros({in}));
    auto conv = ds->register_module("1", std::make_shared<ModuleGroup>());
    ds_conv_weight = conv->register_parameter("weight", at::empty({out, in, 2, 2}));
    ds_conv_bias = conv->register_parameter("bias", at::zeros({out}));
  }
  auto list = register_module("blocks", std::make_shared<ModuleGroup>());
  for (int j = 0; j < depth; ++j)
    blocks.push_back(list->register_module(std::to_string(j), std::make_shared<ConvNextBlock>(out, c)));
}

at::Tensor ConvNextStage::forward(const at::Tensor& x) const {
  auto h = x;
  if (ds_conv_weight.defined())
    h = at::conv2d(layer_norm_2d(h, ds_norm_weight, ds_norm_bias, eps), ds_conv_weight, ds_conv_bias, 2);
  for (const auto& b : blocks) h = b->forward(h);
  return h;
}

ConvNext::ConvNext(const ConvNextConfig& c) : config(c) {
  if (c.depths.size() != 4 || c.dims.size() != 4)
    throw std::invalid_argument("ConvNeXt: depths and dims need four entries (four stages)");
  auto st = register_module("stem", std::make_shared<ModuleGroup>());
  auto conv = st->register_module("0", std::make_shared<ModuleGroup>());
  stem_conv_weight =
      conv->register_parameter("weight", at::empty({c.dims[0], c.in_chans, c.patch_size, c.patch_size}));
  stem_conv_bias = conv->register_parameter("bias", at::zeros({c.dims[0]}));
  auto norm = st->register_module("1", std::make_shared<ModuleGroup>());
  stem_norm_weight = norm->register_parameter("weight", at::ones({c.dims[0]}));
  stem_norm_bias = norm->register_parameter("bias", at::zeros({c.dims[0]}));
  auto list = register_module("stages", std::make_shared<ModuleGroup>());
  int64_t prev = c.dims[0];
  for (int i = 0; i < 4; ++i) {
    // timm: stage 0 keeps the stem's stride-4 grid (no downsampling when its width equals the stem's).
    const bool ds = i > 0 || prev != c.dims[i];
    if (i == 0 && ds) throw std::invalid_argument("ConvNeXt: stage 0 must have the stem's width");
    stages.push_back(list->register_module(
        std::to_string(i), std::make_shared<ConvNextStage>(prev, c.dims[i], c.depths[i], ds, c)));
    prev = c.dims[i];
  }
}

at::Tensor ConvNext::stem(const at::Tensor& x) const {
  auto h =
      at::conv2d(x.to(stem_conv_weight.scalar_type()), stem_conv_weight, stem_conv_bias, config.patch_size);
  return layer_norm_2d(h, stem_norm_weight, stem_norm_bias, config.norm_eps);
}

at::Tensor ConvNext::run_stage(int i, const at::Tensor& x) {
  auto stage = stages.at(i);
  return run_unit(*stage, [&] {
    if (!checkpoint_stages) return stage->forward(x);
    return checkpointed_unit([stage](const at::Tensor& h) { return stage->forward(h); }, x, stage->parameters(),
                             "ConvNeXt stage " + std::to_string(i));
  });
}

at::Tensor ConvNext::forward(const at::Tensor& x) {
  auto h = stem(x);
  for (int i = 0; i < 4; ++i) h = run_stage(i, h);
  return h;
}

void init_convnext_parameter(const std::string& name, at::Tensor& t, at::Generator& gen, const ConvNextConfig& c) {
  auto ends_with = [&](const std::string& suf) {
    return name.size() >= suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0;
  };
  if (ends_with(".gamma") || name == "gamma")
    t.fill_(c.ls_init_value);
  else if (ends_with(".bias"))
    t.zero_();
  else if (t.dim() == 1)
    t.fill_(1.0);  // LayerNorm weights
  else
    t.copy_(at::normal(0.0, c.initializer_range, t.sizes(), gen, at::TensorOptions().dtype(at::kFloat))
                .clamp(-2.0, 2.0)
                .to(t.dtype()));
}

bool convnext_unused_name(const std::string& n) {
  return n.rfind("head.", 0) == 0 || n.rfind("norm_pre.", 0) == 0;
}

}  // namespace gmod

// ConvNeXt as timm builds it (timm.models.convnext.ConvNeXt with the default 'patch' stem, conv_mlp=False):
// stem = conv patch_size x patch_size / patch_size + LayerNorm2d; four stages, stage i > 0 starting with
// LayerNorm2d + conv 2x2/2 downsampling; blocks = depthwise conv k x k -> LayerNorm (channels last) ->
// Linear 4x -> GELU -> Linear -> layer scale -> + residual. Any size by ConvNextConfig (convnext_large_mlp,
// convnext_xxlarge, tiny test shapes). Parameter names are timm's (stem.0.weight,
// stages.1.downsample.1.weight, stages.2.blocks.3.conv_dw.weight, ...mlp.fc1.weight, ...gamma); the
// classifier head is not held (LLaVA-HR reads the last stage's feature map). Checkpoint unit: one stage.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <string>
#include <vector>

#include "model/config.h"

namespace gmod {

class ConvNextBlock : public torch::nn::Module {
 public:
  ConvNextBlock(int64_t dim, const ConvNextConfig& c);
  at::Tensor forward(const at::Tensor& x) const;  // [N, C, H, W]
  at::Tensor dw_weight, dw_bias, norm_weight, norm_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias, gamma;
  double eps;
  int64_t pad;
};

class ConvNextStage : public torch::nn::Module {
 public:
  ConvNextStage(int64_t in_dim, int64_t out_dim, int depth, bool downsample, const ConvNextConfig& c);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor ds_norm_weight, ds_norm_bias, ds_conv_weight, ds_conv_bias;  // undefined without downsampling
  std::vector<std::shared_ptr<ConvNextBlock>> blocks;
  double eps;
};

class ConvNext : public torch::nn::Module {
 public:
  explicit ConvNext(const ConvNextConfig& c);
  // pixels [N, in_chans, S, S] -> the stem's output [N, dims[0], S/4, S/4].
  at::Tensor stem(const at::Tensor& x) const;
  // Stage i; recomputed in the backward instead of keeping its activations when checkpoint_stages.
  at::Tensor run_stage(int i, const at::Tensor& x);
  // stem and all four stages: [N, dims[3], S/32, S/32] (no final norm, as LLaVA-HR reads it).
  at::Tensor forward(const at::Tensor& x);

  ConvNextConfig config;
  at::Tensor stem_conv_weight, stem_conv_bias, stem_norm_weight, stem_norm_bias;
  std::vector<std::shared_ptr<ConvNextStage>> stages;
  bool checkpoint_stages = false;
};

// timm's LayerNorm2d: LayerNorm over the channels of an NCHW tensor.
at::Tensor layer_norm_2d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps);

// Random initialisation of one ConvNeXt parameter (`name` relative to the net) as timm's _init_weights does:
// weights trunc_normal(initializer_range), biases 0, LayerNorm weights 1, layer scales ls_init_value.
void init_convnext_parameter(const std::string& name, at::Tensor& t, at::Generator& gen, const ConvNextConfig& c);

// Whether a timm ConvNeXt checkpoint name is one gmod does not hold (the classifier head, norm_pre).
bool convnext_unused_name(const std::string& timm_name);

}  // namespace gmod

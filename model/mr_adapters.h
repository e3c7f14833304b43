// LLaVA-HR's mixture-of-resolution adapters between its fast (CLIP, tokens [N, L, D]) and slow (ConvNeXt,
// feature map [N, C, h, w]) paths, as multipath_encoder_wapper.py builds them:
//  - StitchAdapter (S2FStitchAlignModuleV2, `align_stages_latent.{0,1,2}`, present when the towers train):
//      slow' = slow_proj(gelu(slow_conv(slow)))            1x1 convs, C -> C -> D
//      slow' is brought to the fast grid (align_grid)
//      fast' = fast + fast_proj(gelu(fast_conv(fast)))     depthwise 7x7 then 1x1 on the fast grid
//      out   = fast' + slow' * tanh(gate(mean_L(cat(fast', slow'))))   gate: Linear 2D -> D/2, GELU, -> 1
//    slow_proj and fast_proj are zero-initialised, so a fresh stitch is the identity.
//  - AlignAdapter (MultiPathAlignModule, `align_stages.0`): out = fast_proj(fast) +
//  slow_proj(align_grid(slow)).
// Parameter names are the original's (slow_conv.weight, gate.0.weight, ...).
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

namespace gmod {

// Tokens [N, l, C] on a square grid brought to `dst` tokens as the original does: upsampled bilinearly with
// align_corners=True (computed in fp32) when l < dst, average-pooled by the integer factor when l > dst.
// Throws when neither count divides the other.
at::Tensor align_grid(const at::Tensor& tokens, int64_t dst);

class StitchAdapter : public torch::nn::Module {
 public:
  StitchAdapter(int64_t fast_dim, int64_t slow_dim);
  at::Tensor forward(const at::Tensor& fast, const at::Tensor& slow) const;
  at::Tensor slow_conv_w, slow_conv_b, slow_proj_w, slow_proj_b, fast_conv_w, fast_conv_b, fast_proj_w,
      fast_proj_b;
  at::Tensor gate0_w, gate0_b, gate2_w, gate2_b;
};

class AlignAdapter : public torch::nn::Module {
 public:
  AlignAdapter(int64_t fast_dim, int64_t slow_dim);
  at::Tensor forward(const at::Tensor& fast, const at::Tensor& slow) const;
  at::Tensor fast_proj_w, fast_proj_b, slow_proj_w, slow_proj_b;
};

}  // namespace gmod

// Mini-Gemini's patch info mining (MGMMetaForCausalLM.unified_resampler with the vlm_uni_* projectors of
// mgm_arch.py): every low-resolution CLIP patch token attends over the high-resolution ConvNeXt features of
// its own square region and takes the attention-weighted mean:
//   regions  r = aux [n, C, g*p, g*p] cut into the g x g regions of p x p pixels, token i <-> region i
//   (row-major) q = Linear(LayerNorm(tokens))  [n, g*g, D]      vlm_uni_query_projector k =
//   Linear(LayerNorm(r))       [n, g*g, p*p, D] vlm_uni_aux_projector v = Linear(LayerNorm(r))       [n, g*g,
//   p*p, D] vlm_uni_val_projector mined_i = mean over the singleton query axis of softmax(q_i . (k_i /
//   sqrt(D))) v_i   (NaNs zeroed first)
// The caller adds `mined` to the tokens (MGM's "token generation"). Parameters (the original's names):
// vlm_uni_{query,aux,val}_projector.{0 = LayerNorm, 1 = Linear}.{weight,bias}.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>

#include "model/clip.h"
#include "model/layers.h"

namespace gmod {

// nn.Sequential(nn.LayerNorm(in), nn.Linear(in, out)) under the names 0.* and 1.*.
class NormLinear : public torch::nn::Module {
 public:
  NormLinear(int64_t in, int64_t out);
  at::Tensor forward(const at::Tensor& x) const { return linear->forward(norm->forward(x)); }
  std::shared_ptr<LayerNormImpl> norm;
  std::shared_ptr<LinearImpl> linear;
};

class PatchInfoMining : public torch::nn::Module {
 public:
  PatchInfoMining(int64_t clip_dim, int64_t aux_dim);
  // tokens [n, g*g, D] (g = floor(sqrt(tokens)), as the original), aux [n, C, g*p, g*p] -> mined [n, g*g, D].
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& aux) const;
  std::shared_ptr<NormLinear> query, key, value;
};

}  // namespace gmod

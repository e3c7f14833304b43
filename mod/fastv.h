// FastV (Chen et al., ECCV 2024, "An Image is Worth 1/2 Tokens After Layer 2") as a routing rule on gmod's
// MoD machinery, following its Hugging Face LLaVA implementation (pkunlp-icler/FastV, llava-hf
// fastv_forward):
//  - layer K-1 runs densely and scores every token by the attention the *last* query row gives it (the last
//    prompt token at prefill), averaged over heads: FastVScoringLayer leaves that [B, L] in
//    ForwardState::routing_scores;
//  - every layer >= K (MoD layers with RouterKind::kFastV) processes the non-image tokens and the
//    round(n_img·(1 - R)) image tokens with the highest score (Python rounding: half to even), at their
//    original RoPE positions; the others pass through unchanged (FastV removes them from the hidden states);
//  - with a KV cache, those layers cache only the kept tokens and every decode token is processed, attending
//  to
//    them (FastV's static KV-cache pruning); a full recompute per step re-scores from the newest token (FastV
//    without a cache).
// Per sample in a batch (FastV itself handles batch element 0); image tokens are the TokenRole::kImage ones.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "mod/mod_config.h"
#include "model/decoder_layer.h"

namespace gmod {

// A MoDConfig for FastV with K and R on an LLM of `num_layers` layers (validated).
MoDConfig fastv_config(int k, double r, int num_layers);
// "K:R" (e.g. "2:0.5") -> fastv_config; errors name the option and the value.
MoDConfig parse_fastv(const std::string& spec, int num_layers);

// Mean over heads of the attention probabilities of each sample's last valid query row: q [B, H, L, Dh],
// k [B, Hkv, L, Dh] (rotary applied), valid [B, L] bool (undefined = all). Causal: the row sees keys up to
// itself. Returns [B, L] fp32 (0 on keys it does not see).
at::Tensor fastv_last_row_scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& valid);

// Tokens a FastV layer processes: every valid non-image token and each sample's top round(n_img·(1 - r))
// image tokens by `scores` [B, L]. roles [B, L] TokenRole (undefined: no image token, all valid processed),
// valid [B, L] bool. Returns [B, L] bool.
at::Tensor fastv_selection(const at::Tensor& scores, const at::Tensor& roles, const at::Tensor& valid,
                           double r);
// round(n·(1 - r)) with Python's rounding (half to even), as FastV computes its kept count.
int64_t fastv_kept_count(int64_t n_image, double r);

// Layer K-1: the dense layer, which also leaves fastv_last_row_scores in ForwardState::routing_scores for a
// full sequence (nothing extra at decode). Holds the dense submodules, so parameter names are unchanged.
class FastVScoringLayer : public DecoderBlock {
 public:
  explicit FastVScoringLayer(const DenseDecoderLayer& dense);
  at::Tensor forward(const at::Tensor& h, ForwardState& st, int layer_idx) override;

  std::shared_ptr<RMSNormImpl> input_layernorm, post_attention_layernorm;
  std::shared_ptr<AttentionImpl> self_attn;
  std::shared_ptr<MLPImpl> mlp;
};

}  // namespace gmod

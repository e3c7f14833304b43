// Routers that decide which tokens a Mixture-of-Depths layer processes:
//  - GammaRouterImpl: γ-MoD's shared Linear(D->2, no bias) on ln_in(h); p = softmax(logits)[..., 1].
//  - ScalarRouterImpl: Raposo et al.'s per-layer Linear(D->1, no bias) on the block input; r scales the
//    whole block delta, sigmoid(r) is the keep probability for the auxiliary loss / causal inference.
//  - A-MoD (parameter-free): the column means of the previous layer's attention probabilities,
//    computed from Q, K and a tiled log-sum-exp without materialising the L x L map, plus the
//    AttentionScoringLayer that makes a dense layer leave those scores for the next MoD layer.
// Logits and softmax are computed in fp32 (double stays double, for gradient checks): the 0.005
// inference threshold is sensitive to bf16 rounding.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "model/decoder_layer.h"
#include "mod/mod_config.h"

namespace gmod {

// fp32, or double when x is double.
at::ScalarType router_compute_dtype(const at::Tensor& x);

class GammaRouterImpl : public torch::nn::Module {
 public:
  // Weight [2, D]; init "kaiming_uniform" (nn.Linear default, bound 1/sqrt(D)), "xavier_uniform" or "zero".
  GammaRouterImpl(int64_t hidden, const std::string& init, uint64_t seed, at::TensorOptions opts);
  at::Tensor logits(const at::Tensor& normed) const;  // ln_in(h) [B, L, D] -> [B, L, 2] (fp32)
  at::Tensor weight;                                  // [2, D]; class 1 = "process"
};

class ScalarRouterImpl : public torch::nn::Module {
 public:
  ScalarRouterImpl(int64_t hidden, const std::string& init, uint64_t seed, at::TensorOptions opts);
  at::Tensor score(const at::Tensor& x) const;  // block input [B, L, D] -> r [B, L] (fp32)
  at::Tensor weight;                            // [1, D]
};

// Per-token A-MoD score: mean over heads and valid queries of the attention probability each key
// receives. q [B, H, L, Dh], k [B, Hkv, L, Dh] with rotary applied; causal attention; `valid` [B, L]
// bool (undefined = all valid) masks padded keys and drops padded query rows. The normaliser is the
// paper's 1/N (N = valid queries of the sample); with `causal_normalise` (adaptation for a causal decoder,
// where column i is seen by fewer queries the later it is) column i is divided by #{valid j >= i} instead.
// Padded columns score 0. Always computed without autograd (the scores only select tokens), so nothing is
// kept for backward. `lse` [B, H, L] (optional): each row's log-sum-exp of its scaled, masked scores as the
// attention kernel returned it; given, one tiled pass sums exp(QK^T * scale - lse) over query rows (the cost
// of the QK^T half of an attention forward); undefined, a first tiled pass builds it. Memory O(L * tile)
// per head. Returns [B, L] fp32.
at::Tensor attention_column_scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& valid,
                                   bool causal_normalise, int64_t tile = 128, const at::Tensor& lse = at::Tensor());
// The same for packed rows (model/segments.h): each segment's columns scored over its own queries, as the sample
// would be alone. index / slots: SegmentLayout::view_index of the [B, L] rows q and k cover. Returns [B, L] fp32
// (0 past the segments).
at::Tensor segment_column_scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& index,
                                 const at::Tensor& slots, bool causal_normalise);
// The same from explicit probabilities [B, H, L, L] (reference for tests).
at::Tensor attention_column_scores_from_probs(const at::Tensor& probs, const at::Tensor& valid,
                                              bool causal_normalise);

// A dense layer that, after its normal forward, leaves A-MoD scores in ForwardState::routing_scores for
// the next (attention-routed) MoD layer. Holds the dense layer's submodules, so parameter names stay
// llm.layers.{i}.self_attn.* etc. Reuses the attention's own rotated Q/K and, when the fused kernel returns it,
// its log-sum-exp: one extra QK^T-sized tiled pass without autograd (two when the kernel gives no lse).
class AttentionScoringLayer : public DecoderBlock {
 public:
  AttentionScoringLayer(const DenseDecoderLayer& dense, bool causal_normalise);
  at::Tensor forward(const at::Tensor& h, ForwardState& st, int layer_idx) override;

  std::shared_ptr<RMSNormImpl> input_layernorm, post_attention_layernorm;
  std::shared_ptr<AttentionImpl> self_attn;
  std::shared_ptr<MLPImpl> mlp;
  bool causal_normalise;
};

// Routing layers (MoD, A-MoD scoring) attend over compacted subsets or assume plain causal attention: on an LLM
// with a sliding window (Mistral) they run only while `length` (the sequence, or the cache at decode) fits in it;
// else an error naming the layer.
void check_within_window(int64_t sliding_window, int64_t length, int layer_idx);

}  // namespace gmod

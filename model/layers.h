// Building blocks of the LLaMA decoder: RMSNorm, rotary embeddings (Hugging Face `rotate_half`
// convention), grouped-query self-attention and the SwiGLU MLP. Parameter names follow Hugging Face
// (q_proj, gate_proj, ...) so checkpoint mapping is a prefix rewrite.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "model/config.h"
#include "model/segments.h"

namespace gmod {

// y = x W^T (+ b). Weight [out, in].
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in, int64_t out, bool bias);
  at::Tensor forward(const at::Tensor& x) const { return at::linear(x, weight, bias); }
  at::Tensor weight, bias;
};

// Matches transformers' LlamaRMSNorm bit for bit: statistics in fp32, cast back, then scale.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight;
  double eps;
};

// cos/sin tables for arbitrary integer positions. inv_freq is computed, not a parameter (HF does not
// store it either), with the config's frequency scaling (RopeScaling).
class RotaryEmbedding {
 public:
  RotaryEmbedding(int64_t head_dim, double theta, RopeScaling scaling = {});
  // The inverse frequencies [Dh/2] fp32 on `device`, bitwise as transformers computes them.
  at::Tensor inv_freq(at::Device device) const;
  // positions [B, L] or [L] (int64) -> cos, sin [B or 1, L, head_dim] in `dtype`.
  std::pair<at::Tensor, at::Tensor> cos_sin(const at::Tensor& positions, at::ScalarType dtype) const;
  int64_t head_dim() const { return head_dim_; }

 private:
  int64_t head_dim_;
  double theta_;
  RopeScaling scaling_;
};

// q, k [B, H, L, Dh]; cos, sin [B, L, Dh].
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// Which keys each query may see. An undefined `allowed` means plain causal attention over a
// fresh sequence (the fast path); otherwise a bool tensor [B, 1, Lq, Lk], true = attend.
struct AttentionMask {
  at::Tensor allowed;
  // Packed rows (model/segments.h): each segment attends causally to itself only. Without `allowed` the
  // attention runs per segment through the fused causal kernel (no [L, L] mask; trailing padding gets zeros); with
  // attention maps requested the explicit path takes the block-diagonal mask. Not with a KV cache.
  std::shared_ptr<const SegmentLayout> segments;
  // Causal mask combined with key padding; key_valid [B, Lk] bool (true = real token).
  // `q_offset` is the position of the first query among the keys (KV-cache decode).
  static AttentionMask causal(const at::Tensor& key_valid, int64_t lq, int64_t lk, int64_t q_offset);
  // This mask limited to a sliding window over sequence indices: the query at index i (the last lq of lk keys)
  // sees keys j with i - window < j <= i, as transformers' sliding_window_overlay.
  AttentionMask within_window(int64_t window, int64_t lq, int64_t lk, at::Device device) const;
};

// Per-layer key/value cache for generation: k, v [B, Hkv, T, Dh].
struct KVCache {
  at::Tensor k, v;
  at::Tensor lengths;  // [B] int64 valid entries per sample when they differ (MoD layers); undefined = all length()
  int64_t length() const { return k.defined() ? k.size(2) : 0; }
};

// What a caller may ask an attention forward to hand back besides its output (A-MoD scoring): the rotated queries
// q [B, H, Lq, Dh] and keys k [B, Hkv, Lk, Dh], detached, and each query row's log-sum-exp of its scaled scores
// lse [B, H, Lq] fp32 (detached) when the fused kernel that ran provides it: plain causal attention (no mask, no
// cache, no explicit probabilities) through the CPU flash kernel, or CUDA's flash (fp16/bf16) or memory-efficient
// (fp32) kernel. Otherwise lse stays undefined. The kernels are the ones SDPA dispatches to, so the output is the
// same as without `side` (bitwise on the CPU).
struct AttentionSide {
  at::Tensor q, k, lse;
};

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const LlamaConfig& c);
  // x [B, L, D] -> [B, L, D]. If `probs` is non-null, the explicit path runs and stores the
  // post-softmax attention probabilities [B, H, Lq, Lk] (fp32). With `cache`, new K/V are appended
  // and queries attend to the whole cache.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const AttentionMask& mask,
                     at::Tensor* probs = nullptr, KVCache* cache = nullptr, AttentionSide* side = nullptr);
  // Query/key projections with rotary applied (for A-MoD column sums): q [B,H,L,Dh], k [B,Hkv,L,Dh].
  std::pair<at::Tensor, at::Tensor> rotated_qk(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

  std::shared_ptr<LinearImpl> q_proj, k_proj, v_proj, o_proj;
  std::shared_ptr<RMSNormImpl> q_norm, k_norm;  // LlamaConfig::qk_norm (Qwen3): over each head, before the rotary
  int64_t n_heads, n_kv_heads, head_dim;
  // > 0: forward limits every query to this many keys ending at itself, by index within the sequence it is given
  // (callers that attend over a subset of a sequence's tokens must not rely on it; see MoDDecoderLayer).
  int64_t sliding_window = 0;
};

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const LlamaConfig& c);
  at::Tensor forward(const at::Tensor& x) const;  // down(silu(gate(x)) * up(x))
  std::shared_ptr<LinearImpl> gate_proj, up_proj, down_proj;
};

// Explicit attention: softmax(q k^T * scale + mask) v with fp32 softmax, as transformers' eager path.
// q [B,H,Lq,Dh], k/v [B,H,Lk,Dh] (already expanded to H heads). Returns output and probs (fp32).
std::pair<at::Tensor, at::Tensor> explicit_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                     const at::Tensor& allowed, bool causal, double scale);

}  // namespace gmod

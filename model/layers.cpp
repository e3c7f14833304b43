#include "model/layers.h"
#include "model/kv_cache.h"
#include "model/lora.h"

#include <ATen/ops/_scaled_dot_product_efficient_attention.h>
#include <ATen/ops/_scaled_dot_product_flash_attention.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <c10/util/Exception.h>

#include <cmath>

namespace gmod {

LinearImpl::LinearImpl(int64_t in, int64_t out, bool with_bias) {
  weight = register_parameter("weight", at::empty({out, in}));
  if (with_bias) bias = register_parameter("bias", at::zeros({out}));
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) const {
  auto xf = x.to(at::kFloat);
  auto var = xf.pow(2).mean(-1, /*keepdim=*/true);
  xf = xf * at::rsqrt(var + eps);
  return weight * xf.to(x.scalar_type());
}

RotaryEmbedding::RotaryEmbedding(int64_t head_dim, double theta, RopeScaling scaling)
    : head_dim_(head_dim), theta_(theta), scaling_(std::move(scaling)) {}

at::Tensor RotaryEmbedding::inv_freq(at::Device device) const {
  auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  // 1 / theta^(arange(0, d, 2) / d) in fp32, as transformers' _compute_default_rope_parameters.
  auto exponent = at::arange(0, head_dim_, 2, opts.dtype(at::kLong)).to(at::kFloat) / static_cast<double>(head_dim_);
  auto inv = 1.0 / at::pow(theta_, exponent);  // [Dh/2] (the unscaled path as before, bitwise)
  const RopeScaling& s = scaling_;
  if (s.type == "linear") return inv / s.factor;
  if (s.type != "llama3") return inv;
  // _compute_llama3_parameters, step for step in fp32: long wavelengths (low frequencies) are slowed by `factor`,
  // short ones kept, and the band between interpolated. Python's `scalar / tensor` is reciprocal() * scalar.
  const double old_len = s.original_max_position_embeddings;
  const double low_freq_wavelen = old_len / s.low_freq_factor;
  const double high_freq_wavelen = old_len / s.high_freq_factor;
  auto wavelen = inv.reciprocal() * (2 * M_PI);
  auto scaled = at::where(wavelen > low_freq_wavelen, inv / s.factor, inv);
  auto smooth = (wavelen.reciprocal() * old_len - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  auto smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
  auto medium = (wavelen < high_freq_wavelen).logical_not() & (wavelen > low_freq_wavelen).logical_not();
  return at::where(medium, smoothed, scaled);
}

std::pair<at::Tensor, at::Tensor> RotaryEmbedding::cos_sin(const at::Tensor& positions, at::ScalarType dtype) const {
  auto inv = inv_freq(positions.device());                                // [Dh/2]
  auto pos = positions.dim() == 1 ? positions.unsqueeze(0) : positions;  // [B, L]
  auto freqs = pos.to(at::kFloat).unsqueeze(-1) * inv;                   // [B, L, Dh/2]
  auto emb = at::cat({freqs, freqs}, -1);                                // [B, L, Dh]
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  auto half = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, half);
  auto x2 = x.narrow(-1, half, half);
  auto rotated = at::cat({-x2, x1}, -1);
  auto c = cos.unsqueeze(1), s = sin.unsqueeze(1);  // broadcast over heads
  return x * c + rotated * s;
}

AttentionMask AttentionMask::causal(const at::Tensor& key_valid, int64_t lq, int64_t lk, int64_t q_offset) {
  auto dev = key_valid.defined() ? key_valid.device() : at::Device(at::kCPU);
  auto qi = at::arange(q_offset, q_offset + lq, at::TensorOptions().dtype(at::kLong).device(dev)).unsqueeze(1);
  auto ki = at::arange(lk, at::TensorOptions().dtype(at::kLong).device(dev)).unsqueeze(0);
  auto allowed = (ki <= qi).unsqueeze(0).unsqueeze(0);  // [1,1,Lq,Lk]
  if (key_valid.defined()) {
    allowed = allowed & key_valid.to(at::kBool).unsqueeze(1).unsqueeze(1);  // [B,1,Lq,Lk]
    // A padded query whose keys are all masked would produce NaN; let it see itself.
    if (lq + q_offset <= lk) allowed = allowed | (ki == qi).unsqueeze(0).unsqueeze(0);
  }
  return AttentionMask{allowed, nullptr};
}

AttentionMask AttentionMask::within_window(int64_t window, int64_t lq, int64_t lk, at::Device device) const {
  auto opts = at::TensorOptions().dtype(at::kLong).device(allowed.defined() ? allowed.device() : device);
  auto qi = at::arange(lk - lq, lk, opts).unsqueeze(1);
  auto ki = at::arange(lk, opts).unsqueeze(0);
  auto band = ((ki <= qi) & (ki > qi - window)).unsqueeze(0).unsqueeze(0);  // [1,1,Lq,Lk], causal within the window
  return AttentionMask{allowed.defined() ? allowed & band : band, nullptr};
}

namespace {
at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  auto s = x.sizes();  // [B, Hkv, L, Dh]
  return x.unsqueeze(2).expand({s[0], s[1], n_rep, s[2], s[3]}).reshape({s[0], s[1] * n_rep, s[2], s[3]});
}

// SDPA over grouped K/V heads. Its enable_gqa is served by the flash kernel only (bf16/fp16, no mask); on CUDA
// with an explicit mask (left padding, ragged batches) or fp32 it would fall to the math path, which materialises
// [B, H, L, L] scores. There the K/V heads are repeated first (a transient [B, H, L, Dh] copy) so the
// memory-efficient kernel serves. The CPU keeps enable_gqa (its flash kernel takes masks and fp32).
at::Tensor grouped_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const std::optional<at::Tensor>& mask, bool causal, double scale, int64_t rep) {
  const bool repeat = rep > 1 && q.is_cuda() && (mask.has_value() || q.scalar_type() == at::kFloat);
  if (repeat)
    return at::scaled_dot_product_attention(q, repeat_kv(k, rep), repeat_kv(v, rep), mask, 0.0, causal, scale);
  return at::scaled_dot_product_attention(q, k, v, mask, 0.0, causal, scale, /*enable_gqa=*/rep > 1);
}

// Plain causal attention through the fused kernel SDPA would pick, keeping the per-row log-sum-exp it computes
// anyway. Returns {out [B,H,L,Dh], lse [B,H,L] fp32}, or {undefined, undefined} when no such kernel applies.
std::pair<at::Tensor, at::Tensor> causal_attention_with_lse(const at::Tensor& q, const at::Tensor& k,
                                                            const at::Tensor& v, double scale) {
  const auto dt = q.scalar_type();
  if (q.device().is_cpu()) {
    if (dt != at::kFloat && dt != at::kDouble && dt != at::kBFloat16 && dt != at::kHalf) return {};
    auto r = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, /*is_causal=*/true, std::nullopt, scale);
    return {std::get<0>(r), std::get<1>(r)};
  }
  if (!q.device().is_cuda()) return {};
  try {
    if (dt == at::kHalf || dt == at::kBFloat16) {
      auto r = at::_scaled_dot_product_flash_attention(q, k, v, 0.0, /*is_causal=*/true, false, scale);
      return {std::get<0>(r), std::get<1>(r)};
    }
    if (dt == at::kFloat) {
      auto r = at::_scaled_dot_product_efficient_attention(q, k, v, std::nullopt, /*compute_log_sumexp=*/true, 0.0,
                                                           /*is_causal=*/true, scale);
      return {std::get<0>(r), std::get<1>(r).narrow(2, 0, q.size(2))};  // lse may be padded to a tile multiple
    }
  } catch (const c10::Error&) {  // shape or architecture the kernel does not support: the caller falls back
  }
  return {};
}

// Packed rows: each segment's causal attention through the fused kernel (a sliding window applies within the
// segment), one call per segment; a row's trailing padding gets zeros (nothing reads it). q [B,H,L,Dh],
// k/v [B,Hkv,L,Dh] -> [B,H,L,Dh]. The slices come from one unbind and one split per row, whose backward is one
// stack / cat (a narrow per segment would zero-fill a full-size gradient per segment).
at::Tensor segmented_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const SegmentLayout& layout, double scale, int64_t rep, int64_t window) {
  const int64_t B = q.size(0), L = q.size(2);
  layout.check(B, L, "attention");
  const auto qr = q.unbind(0), kr = k.unbind(0), vr = v.unbind(0);  // [H, L, Dh] per row
  std::vector<at::Tensor> rows;
  rows.reserve(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> sizes = layout.rows[static_cast<size_t>(b)];
    const int64_t covered = layout.row_length(b);
    if (covered < L) sizes.push_back(L - covered);
    const auto qs = qr[size_t(b)].split_with_sizes(sizes, 1), ks = kr[size_t(b)].split_with_sizes(sizes, 1),
               vs = vr[size_t(b)].split_with_sizes(sizes, 1);
    std::vector<at::Tensor> parts;
    for (size_t j = 0; j < layout.rows[size_t(b)].size(); ++j) {
      const int64_t len = sizes[j];
      auto qj = qs[j].unsqueeze(0), kj = ks[j].unsqueeze(0), vj = vs[j].unsqueeze(0);
      if (window > 0 && len > window) {
        auto band = AttentionMask{}.within_window(window, len, len, q.device()).allowed;
        parts.push_back(grouped_sdpa(qj, kj, vj, band, false, scale, rep).squeeze(0));
      } else {
        parts.push_back(grouped_sdpa(qj, kj, vj, std::nullopt, true, scale, rep).squeeze(0));
      }
    }
    if (covered < L) parts.push_back(at::zeros({q.size(1), L - covered, q.size(3)}, q.options()));
    rows.push_back(parts.size() == 1 ? parts[0] : at::cat(parts, 1));
  }
  return at::stack(rows, 0);
}

}  // namespace

std::pair<at::Tensor, at::Tensor> explicit_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                     const at::Tensor& allowed, bool causal, double scale) {
  auto scores = at::matmul(q, k.transpose(-1, -2)) * scale;  // [B,H,Lq,Lk]
  if (allowed.defined()) {
    scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  } else if (causal) {
    auto lq = q.size(2), lk = k.size(2);
    auto m = at::ones({lq, lk}, q.options().dtype(at::kBool)).triu(lk - lq + 1);
    scores = scores.masked_fill(m, -std::numeric_limits<float>::infinity());
  }
  auto probs = at::softmax(scores, -1, at::kFloat);
  auto out = at::matmul(probs.to(q.scalar_type()), v);
  return {out, probs};
}

AttentionImpl::AttentionImpl(const LlamaConfig& c)
    : n_heads(c.num_attention_heads),
      n_kv_heads(c.num_key_value_heads),
      head_dim(c.dim_per_head()),
      sliding_window(c.sliding_window) {
  const bool qkv_bias = c.attention_bias || c.qkv_bias;
  q_proj = register_module("q_proj", std::make_shared<LinearImpl>(c.hidden_size, n_heads * head_dim, qkv_bias));
  k_proj = register_module("k_proj", std::make_shared<LinearImpl>(c.hidden_size, n_kv_heads * head_dim, qkv_bias));
  v_proj = register_module("v_proj", std::make_shared<LinearImpl>(c.hidden_size, n_kv_heads * head_dim, qkv_bias));
  o_proj = register_module("o_proj", std::make_shared<LinearImpl>(n_heads * head_dim, c.hidden_size, c.attention_bias));
  if (c.qk_norm) {
    q_norm = register_module("q_norm", std::make_shared<RMSNormImpl>(head_dim, c.rms_norm_eps));
    k_norm = register_module("k_norm", std::make_shared<RMSNormImpl>(head_dim, c.rms_norm_eps));
  }
}

std::pair<at::Tensor, at::Tensor> AttentionImpl::rotated_qk(const at::Tensor& x, const at::Tensor& cos,
                                                            const at::Tensor& sin) {
  auto B = x.size(0), L = x.size(1);
  auto q = lora_linear(*q_proj, x).view({B, L, n_heads, head_dim});
  auto k = lora_linear(*k_proj, x).view({B, L, n_kv_heads, head_dim});
  if (q_norm) q = q_norm->forward(q), k = k_norm->forward(k);
  q = q.transpose(1, 2), k = k.transpose(1, 2);
  return {apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)};
}

at::Tensor AttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                  const AttentionMask& given_mask, at::Tensor* probs, KVCache* cache,
                                  AttentionSide* side) {
  auto B = x.size(0), L = x.size(1);
  auto [q, k] = rotated_qk(x, cos, sin);
  auto v = lora_linear(*v_proj, x).view({B, L, n_kv_heads, head_dim}).transpose(1, 2);
  if (cache) {
    kv_append(*cache, k, v);  // in place into the cache's buffer (model/kv_cache.h)
    k = cache->k;
    v = cache->v;
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  const int64_t rep = n_heads / n_kv_heads;
  if (given_mask.segments && !given_mask.allowed.defined()) {
    if (cache) throw std::logic_error("attention: packed rows (segments) cannot use a KV cache");
    if (side) *side = AttentionSide{q.detach(), k.detach(), at::Tensor()};
    at::Tensor out;
    if (probs) {  // attention maps: the explicit path over the block-diagonal causal mask
      auto r = explicit_attention(q, repeat_kv(k, rep), repeat_kv(v, rep),
                                  given_mask.segments->block_causal_mask(L, x.device()), false, scale);
      out = r.first;
      *probs = r.second;
    } else {
      out = segmented_attention(q, k, v, *given_mask.segments, scale, rep, sliding_window);
    }
    return lora_linear(*o_proj, out.transpose(1, 2).reshape({B, L, n_heads * head_dim}));
  }
  // A window shorter than the keys turns the plain causal fast path into an explicit mask.
  const AttentionMask mask = sliding_window > 0 && k.size(2) > sliding_window
                                 ? given_mask.within_window(sliding_window, L, k.size(2), x.device())
                                 : given_mask;
  const bool causal = !mask.allowed.defined();
  if (causal && k.size(2) != L)
    throw std::logic_error("attention: a KV cache needs an explicit mask (AttentionMask::causal)");
  at::Tensor out;
  if (side) {
    side->q = q.detach();
    side->k = k.detach();
    side->lse = at::Tensor();
    if (causal && !probs && !cache) {
      auto r = causal_attention_with_lse(q, repeat_kv(k, rep), repeat_kv(v, rep), scale);
      if (r.first.defined()) {
        out = r.first;
        side->lse = r.second.detach().to(at::kFloat);
      }
    }
  }
  if (out.defined()) {
    // fused kernel with its log-sum-exp (above)
  } else if (probs) {
    auto r = explicit_attention(q, repeat_kv(k, rep), repeat_kv(v, rep), mask.allowed, causal, scale);
    out = r.first;
    *probs = r.second;
  } else {
    // An undefined tensor inside the optional is not "no mask" to SDPA: pass nullopt explicitly.
    auto m = mask.allowed.defined() ? std::optional<at::Tensor>(mask.allowed) : std::nullopt;
    out = grouped_sdpa(q, k, v, m, causal, scale, rep);
  }
  out = out.transpose(1, 2).reshape({B, L, n_heads * head_dim});
  return lora_linear(*o_proj, out);
}

MLPImpl::MLPImpl(const LlamaConfig& c) {
  gate_proj = register_module("gate_proj", std::make_shared<LinearImpl>(c.hidden_size, c.intermediate_size, c.mlp_bias));
  up_proj = register_module("up_proj", std::make_shared<LinearImpl>(c.hidden_size, c.intermediate_size, c.mlp_bias));
  down_proj = register_module("down_proj", std::make_shared<LinearImpl>(c.intermediate_size, c.hidden_size, c.mlp_bias));
}

at::Tensor MLPImpl::forward(const at::Tensor& x) const {
  return lora_linear(*down_proj, at::silu(lora_linear(*gate_proj, x)) * lora_linear(*up_proj, x));
}

}  // namespace gmod

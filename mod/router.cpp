#include "mod/router.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <limits>
#include <stdexcept>

namespace gmod {

namespace {

at::Tensor init_router_weight(int64_t out, int64_t in, const std::string& init, uint64_t seed, at::TensorOptions opts) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto cpu = at::TensorOptions().dtype(at::kFloat);
  at::Tensor w;
  if (init == "zero") {
    w = at::zeros({out, in}, cpu);
  } else if (init == "kaiming_uniform") {
    // nn.Linear's default: kaiming_uniform(a = sqrt(5)) -> U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    const double b = 1.0 / std::sqrt(static_cast<double>(in));
    w = at::empty({out, in}, cpu).uniform_(-b, b, gen);
  } else if (init == "xavier_uniform") {
    const double b = std::sqrt(6.0 / static_cast<double>(in + out));
    w = at::empty({out, in}, cpu).uniform_(-b, b, gen);
  } else {
    throw std::invalid_argument("router: unknown init \"" + init + "\" (kaiming_uniform, xavier_uniform, zero)");
  }
  return w.to(opts);
}

}  // namespace

at::ScalarType router_compute_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

GammaRouterImpl::GammaRouterImpl(int64_t hidden, const std::string& init, uint64_t seed, at::TensorOptions opts) {
  weight = register_parameter("weight", init_router_weight(2, hidden, init, seed, opts));
}

at::Tensor GammaRouterImpl::logits(const at::Tensor& normed) const {
  const auto ct = router_compute_dtype(normed);
  return at::linear(normed.to(ct), weight.to(ct));
}

ScalarRouterImpl::ScalarRouterImpl(int64_t hidden, const std::string& init, uint64_t seed, at::TensorOptions opts) {
  weight = register_parameter("weight", init_router_weight(1, hidden, init, seed, opts));
}

at::Tensor ScalarRouterImpl::score(const at::Tensor& x) const {
  const auto ct = router_compute_dtype(x);
  return at::linear(x.to(ct), weight.to(ct)).squeeze(-1);
}

namespace {

// Number of valid queries that see key i (#{valid j >= i}) or all valid queries; [B, L], >= 1.
at::Tensor column_denominator(const at::Tensor& vb, bool causal_normalise, at::ScalarType ct) {
  auto v = vb.to(ct);
  auto d = causal_normalise ? v.flip({1}).cumsum(1).flip({1}) : v.sum(1, /*keepdim=*/true).expand_as(v);
  return d.clamp_min(1.0);
}

}  // namespace

at::Tensor attention_column_scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& valid,
                                   bool causal_normalise, int64_t tile, const at::Tensor& given_lse) {
  if (q.dim() != 4 || k.dim() != 4 || q.size(2) != k.size(2) || q.size(1) % k.size(1) != 0)
    throw std::invalid_argument("attention_column_scores: expected q [B,H,L,Dh] and k [B,Hkv,L,Dh] with H % Hkv == 0");
  if (given_lse.defined() && (given_lse.dim() != 3 || given_lse.size(0) != q.size(0) || given_lse.size(1) != q.size(1) ||
                              given_lse.size(2) != q.size(2)))
    throw std::invalid_argument("attention_column_scores: lse must be [B, H, L] like q's first three dimensions");
  at::NoGradGuard no_grad;  // scores only select tokens: nothing of this pass is kept for backward
  const auto ct = router_compute_dtype(q);
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), Dh = q.size(3);
  auto qf = q.to(ct);
  auto kf = k.to(ct).repeat_interleave(H / k.size(1), 1);  // [B, H, L, Dh] (HF repeat_kv order)
  const double scale = 1.0 / std::sqrt(static_cast<double>(Dh));
  auto iopts = at::TensorOptions().dtype(at::kLong).device(q.device());
  auto vb = valid.defined() ? valid.to(at::kBool) : at::ones({B, L}, iopts.dtype(at::kBool));
  auto pos = at::arange(L, iopts);
  const double ninf = -std::numeric_limits<double>::infinity();
  tile = std::max<int64_t>(tile, 1);

  // Scores of query rows [r0, r1) against key columns [c0, c1), masked causal + key padding.
  auto block = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    auto s = at::matmul(qf.narrow(2, r0, r1 - r0), kf.narrow(2, c0, c1 - c0).transpose(-1, -2)) * scale;
    auto allowed = pos.narrow(0, c0, c1 - c0).unsqueeze(0) <= pos.narrow(0, r0, r1 - r0).unsqueeze(1);  // [Tr,Tc]
    allowed = allowed.unsqueeze(0) & vb.narrow(1, c0, c1 - c0).unsqueeze(1);                            // [B,Tr,Tc]
    return s.masked_fill(allowed.unsqueeze(1).logical_not(), ninf);                                     // [B,H,Tr,Tc]
  };

  // Pass 1 (unless the attention kernel handed it over): per-row log-sum-exp, accumulated over key tiles at or
  // left of the diagonal.
  at::Tensor lse;
  if (given_lse.defined()) {
    lse = given_lse.to(ct);
  } else {
    std::vector<at::Tensor> lse_rows;
    for (int64_t r0 = 0; r0 < L; r0 += tile) {
      const int64_t r1 = std::min(L, r0 + tile);
      auto l = at::full({B, H, r1 - r0}, ninf, qf.options());
      for (int64_t c0 = 0; c0 < r1; c0 += tile)
        l = at::logaddexp(l, at::logsumexp(block(r0, r1, c0, std::min(L, c0 + tile)), -1));
      lse_rows.push_back(l);
    }
    lse = at::cat(lse_rows, 2);  // [B, H, L]
  }
  // Padded query rows do not count: an lse of +inf makes their exp(S - lse) exactly 0 (so does a row that sees
  // nothing, whose scores are all -inf).
  lse = lse.masked_fill(vb.logical_not().unsqueeze(1), std::numeric_limits<double>::infinity());

  // Pass 2: column sums of exp(S - lse) over query tiles at or below the diagonal.
  std::vector<at::Tensor> cols;
  for (int64_t c0 = 0; c0 < L; c0 += tile) {
    const int64_t c1 = std::min(L, c0 + tile);
    auto acc = at::zeros({B, H, c1 - c0}, qf.options());
    for (int64_t r0 = (c0 / tile) * tile; r0 < L; r0 += tile) {
      const int64_t r1 = std::min(L, r0 + tile);
      acc = acc + at::exp(block(r0, r1, c0, c1) - lse.narrow(2, r0, r1 - r0).unsqueeze(-1)).sum(2);
    }
    cols.push_back(acc);
  }
  auto col = at::cat(cols, 2).mean(1);  // [B, L], mean over heads
  auto score = col / column_denominator(vb, causal_normalise, ct);
  return at::where(vb, score, at::zeros_like(score)).to(at::kFloat);
}

at::Tensor segment_column_scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& index,
                                 const at::Tensor& slots, bool causal_normalise) {
  at::NoGradGuard no_grad;
  auto per_segment = [&](const at::Tensor& x) {  // [B, H, L, Dh] -> [S, H, M, Dh]
    return to_segment_view(x.transpose(1, 2), index).transpose(1, 2);
  };
  const auto s = attention_column_scores(per_segment(q), per_segment(k), slots, causal_normalise);  // [S, M]
  return from_segment_view(s, index, slots, at::zeros({q.size(0), q.size(2)}, s.options()));
}

at::Tensor attention_column_scores_from_probs(const at::Tensor& probs, const at::Tensor& valid, bool causal_normalise) {
  const int64_t B = probs.size(0), L = probs.size(2);
  const auto ct = router_compute_dtype(probs);
  auto vb = valid.defined() ? valid.to(at::kBool)
                            : at::ones({B, L}, at::TensorOptions().dtype(at::kBool).device(probs.device()));
  auto p = probs.to(ct) * vb.to(ct).unsqueeze(1).unsqueeze(-1);
  auto score = p.sum(2).mean(1) / column_denominator(vb, causal_normalise, ct);
  return at::where(vb, score, at::zeros_like(score)).to(at::kFloat);
}

AttentionScoringLayer::AttentionScoringLayer(const DenseDecoderLayer& d, bool cn) : causal_normalise(cn) {
  self_attn = register_module("self_attn", d.self_attn);
  mlp = register_module("mlp", d.mlp);
  input_layernorm = register_module("input_layernorm", d.input_layernorm);
  post_attention_layernorm = register_module("post_attention_layernorm", d.post_attention_layernorm);
}

void check_within_window(int64_t sliding_window, int64_t length, int layer_idx) {
  // Routed layers attend over a compacted subset of the tokens, whose indices are not the sequence's: a window
  // that would cut into the sequence has no defined meaning there.
  if (sliding_window > 0 && length > sliding_window)
    throw std::invalid_argument("MoD layer " + std::to_string(layer_idx) + ": a sequence of " +
                                std::to_string(length) + " tokens is longer than the LLM's sliding_window (" +
                                std::to_string(sliding_window) +
                                "); routing on a sliding-window model is supported only within the window");
}

at::Tensor AttentionScoringLayer::forward(const at::Tensor& h, ForwardState& st, int layer_idx) {
  KVCache* cache = st.caches ? &(*st.caches)[layer_idx] : nullptr;
  const bool decode = cache && cache->k.defined();
  // The column scores assume plain causal attention over the whole sequence.
  if (!decode) check_within_window(self_attn->sliding_window, st.segments ? st.segments->longest_segment() : h.size(1), layer_idx);
  at::Tensor probs;
  AttentionSide side;
  auto n = input_layernorm->forward(h);
  // A-MoD layers process every token at decode, so scores are only needed for full sequences.
  auto a = self_attn->forward(n, st.cos, st.sin, st.mask, st.want_attn_probs ? &probs : nullptr, cache,
                              decode ? nullptr : &side);
  if (st.want_attn_probs) st.attn_probs.push_back(probs);
  if (!decode)
    st.routing_scores = st.segments ? segment_column_scores(side.q, side.k, st.segment_index, st.segment_slots,
                                                            causal_normalise)
                                    : attention_column_scores(side.q, side.k, st.key_valid, causal_normalise, 128, side.lse);
  auto x = h + a;
  st.tokens.push_back({layer_idx, st.valid_tokens, st.valid_tokens});
  return x + mlp->forward(post_attention_layernorm->forward(x));
}

}  // namespace gmod

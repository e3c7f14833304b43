// One decode step of a MoD layer ([B, 1, D], filled per-layer KV cache): the router decides per sample, and only
// the samples that process go through the layer's matmuls. Their rows, positions and caches are gathered, the
// layer runs on those P rows, their new K/V are written into their cache slots and their outputs scattered back;
// skipped samples leave the layer bit-identical with their cache unchanged (γ-MoD's LLaVA-HR decode rule). The
// accounting entry reports exactly the P tokens and their attention pairs computed.
#include <cmath>
#include <stdexcept>

#include "mod/mod_layer.h"
#include "mod/routing_rule.h"
#include "model/token_roles.h"

namespace gmod {

at::Tensor MoDDecoderLayer::decode_step(const at::Tensor& h, ForwardState& st, int layer_idx, KVCache& cache) {
  const int64_t B = h.size(0);
  if (h.size(1) != 1)
    throw std::invalid_argument("MoD layer " + std::to_string(layer_idx) +
                                ": a forward with a filled KV cache must be one decode token per sample");
  auto dev = h.device();
  const auto lopts = at::TensorOptions().dtype(at::kLong).device(dev);
  auto keep = st.key_valid.defined() ? st.key_valid.select(1, st.key_valid.size(1) - 1).to(at::kBool)
                                      : at::ones({B}, at::TensorOptions().dtype(at::kBool).device(dev));
  if (st.token_roles.defined())
    keep = keep & (st.token_roles.select(1, st.token_roles.size(1) - 1) != static_cast<int64_t>(TokenRole::kPad));
  const auto qvalid = keep;
  auto sc = score(h);
  if (sc.keep_prob.defined() && cfg.decode_skip && cfg.adaptive_threshold == AdaptiveThreshold::kNone)
    keep = keep & (sc.keep_prob.select(1, 0) >= cfg.decode_threshold);
  else if (sc.keep_prob.defined() && cfg.decode_skip)  // adaptive (mod/routing_rule.h): seqlen counts this token too
    keep = keep & (sc.keep_prob.select(1, 0) >= adaptive_decode_thresholds(cfg, layer_idx, st.key_valid, B, cache.length() + 1)
                                                    .to(sc.keep_prob.options()));
  if (record_selection) recorded.push_back(keep.unsqueeze(1));
  auto lengths = cache.lengths.defined() ? cache.lengths : at::full({B}, cache.length(), lopts);

  // The processing samples (decode is inference: one small host copy per layer and step).
  const auto idx = keep.nonzero().squeeze(1);  // [P]
  const int64_t P = idx.size(0);
  const auto lp = lengths.index_select(0, idx);  // [P] their cached tokens
  auto stats = at::stack({qvalid.sum(), (lp + 1).sum(), P ? lp.max() : at::zeros({}, lopts)}).cpu();
  auto sa = stats.accessor<int64_t, 1>();
  // A decode token of any role may be skipped when the router decides at decode; otherwise none is routable.
  st.tokens.push_back({layer_idx, P, sa[0], sa[1], sc.keep_prob.defined() && cfg.decode_skip ? sa[0] : 0});
  if (P == 0) return h;
  check_within_window(self_attn->sliding_window, sa[2] + 1, layer_idx);

  int64_t T = cache.length();
  if (sa[2] >= T) {  // grow in chunks; slots beyond a sample's length are masked
    const int64_t grow = 16;
    auto pad = at::zeros({B, cache.k.size(1), grow, cache.k.size(3)}, cache.k.options());
    cache.k = at::cat({cache.k, pad}, 2);
    cache.v = at::cat({cache.v, pad}, 2);
    T += grow;
  }
  const bool all = P == B;
  auto hp = all ? h : h.index_select(0, idx);  // [P, 1, D]
  auto pos = cfg.rope_positions == RopePositions::kCompacted
                 ? lp.unsqueeze(1)
                 : st.positions.expand({B, 1}).narrow(1, 0, 1).index_select(0, idx);
  auto [cos, sin] = st.rope->cos_sin(pos, h.scalar_type());
  auto n = sc.normed.defined() ? (all ? sc.normed : sc.normed.index_select(0, idx)) : input_layernorm->forward(hp);
  auto qk = self_attn->rotated_qk(n, cos, sin);  // q [P, H, 1, Dh], k [P, Hkv, 1, Dh]
  const int64_t Hkv = self_attn->n_kv_heads, Dh = self_attn->head_dim, H = self_attn->n_heads;
  auto v = self_attn->v_proj->forward(n).view({P, 1, Hkv, Dh}).transpose(1, 2);
  // New K/V into slot lp[p] of sample idx[p], in place ([B, T, Hkv, Dh] views of the caches).
  cache.k.transpose(1, 2).index_put_({at::indexing::TensorIndex(idx), at::indexing::TensorIndex(lp)}, qk.second.squeeze(2).to(cache.k.scalar_type()));
  cache.v.transpose(1, 2).index_put_({at::indexing::TensorIndex(idx), at::indexing::TensorIndex(lp)}, v.squeeze(2).to(cache.v.scalar_type()));
  auto kp = all ? cache.k : cache.k.index_select(0, idx);  // [P, Hkv, T, Dh]
  auto vp = all ? cache.v : cache.v.index_select(0, idx);
  auto allowed = (at::arange(T, lopts).unsqueeze(0) <= lp.unsqueeze(1)).view({P, 1, 1, T});
  auto o = at::scaled_dot_product_attention(qk.first, kp, vp, allowed, 0.0, false,
                                            1.0 / std::sqrt(static_cast<double>(Dh)), /*enable_gqa=*/H != Hkv);
  auto a = hp + self_attn->o_proj->forward(o.transpose(1, 2).reshape({P, 1, H * Dh}));
  auto m = mlp->forward(post_attention_layernorm->forward(a));
  auto w = sc.weight.defined() ? (all ? sc.weight : sc.weight.index_select(0, idx)) : at::Tensor();
  auto y = combine(hp, a, m, w);
  cache.lengths = lengths + keep.to(at::kLong);
  return all ? y : h.index_copy(0, idx, y.to(h.scalar_type()));
}

}  // namespace gmod

// One decode step of a MoD layer ([B, 1, D], filled per-layer KV cache): the router decides per sample, and only
// the P samples that process go through the layer's matmuls; skipped samples leave the layer bit-identical with
// their cache unchanged (γ-MoD's LLaVA-HR decode rule). P = 0 skips the layer's matmuls altogether. The accounting
// entry reports exactly the P tokens and their attention pairs computed.
//
// What it costs besides the matmuls of the P rows (it used to realise a tenth of the FLOP saving in time):
// - one device-to-host copy per layer and step (who processes, who is a real query, every cached length), from which
//   P, the accounting and the attention runs are known on the host; the processing samples' indices come from a
//   stable sort on the device (no host-to-device copy);
// - the caches are slot views (model/kv_cache.h): each processing sample's new K/V is written into its own next slot
//   in place, and attention reads the caches of each run of consecutive processing samples as a view (no gather of
//   the caches), masked to each sample's length unless the run's lengths are equal;
// - the processing rows of h, the router's normed input and weight are gathered ([P, 1, D]) and the outputs copied
//   back into h.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "mod/mod_layer.h"
#include "model/kv_cache.h"
#include "model/lora.h"
#include "mod/routing_rule.h"
#include "mod/token_selection.h"
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
  // The method's decode scores (p-MoD routes image tokens only: none, a decode token is always processed, unscaled).
  auto sc = method->decode_scores(*this, h);
  const bool routed = sc.keep_prob.defined() && cfg.decode_skip;
  if (routed && cfg.adaptive_threshold == AdaptiveThreshold::kNone)
    keep = keep & (sc.keep_prob.select(1, 0) >= cfg.decode_threshold);
  else if (routed)  // adaptive (mod/routing_rule.h): seqlen counts this token too
    keep = keep & (sc.keep_prob.select(1, 0) >=
                   adaptive_decode_thresholds(cfg, layer_idx, st.key_valid, B, cache.length() + 1)
                       .to(sc.keep_prob.options()));
  if (record_selection) recorded.push_back(keep.unsqueeze(1));
  auto lengths = cache.lengths.defined() ? cache.lengths : at::full({B}, cache.length(), lopts);

  // The one device-to-host copy of this layer and step.
  const auto host = at::stack({keep.to(at::kLong), qvalid.to(at::kLong), lengths.to(at::kLong)}).cpu();
  const auto ha = host.accessor<int64_t, 2>();
  std::vector<int64_t> sel, lp_host;  // processing samples (ascending) and their cached tokens
  int64_t n_valid = 0, pairs = 0, slots = 0;
  for (int64_t b = 0; b < B; ++b) {
    n_valid += ha[1][b];
    if (!ha[0][b]) continue;
    sel.push_back(b);
    lp_host.push_back(ha[2][b]);
    pairs += ha[2][b] + 1;
    slots = std::max(slots, ha[2][b] + 1);
  }
  const int64_t P = static_cast<int64_t>(sel.size());
  // A decode token of any role may be skipped when the router decides at decode; otherwise none is routable.
  st.tokens.push_back({layer_idx, P, n_valid, pairs, routed ? n_valid : 0});
  if (P == 0) return h;
  check_within_window(self_attn->sliding_window, slots, layer_idx);
  kv_grow(cache, slots);  // in place unless the buffer is full

  const bool all = P == B;
  // Processing samples first in batch order: a stable sort of the decisions, on the device.
  const auto idx = all ? at::arange(B, lopts) : at::argsort(keep.to(at::kInt), /*stable=*/true, 0, /*descending=*/true).narrow(0, 0, P);
  const auto lp = all ? lengths : lengths.index_select(0, idx);  // [P]
  auto hp = all ? h : h.index_select(0, idx);                     // [P, 1, D]
  auto pos = cfg.rope_positions == RopePositions::kCompacted
                 ? lp.unsqueeze(1)
                 : (all ? st.positions.expand({B, 1}) : st.positions.expand({B, 1}).index_select(0, idx));
  auto [cos, sin] = st.rope->cos_sin(pos, h.scalar_type());
  auto n = sc.normed.defined() ? (all ? sc.normed : sc.normed.index_select(0, idx)) : input_layernorm->forward(hp);
  auto qk = self_attn->rotated_qk(n, cos, sin);  // q [P, H, 1, Dh], k [P, Hkv, 1, Dh]
  const int64_t Hkv = self_attn->n_kv_heads, Dh = self_attn->head_dim, H = self_attn->n_heads;
  auto v = lora_linear(*self_attn->v_proj, n).view({P, 1, Hkv, Dh}).transpose(1, 2);
  // New K/V into slot lp[p] of sample idx[p], in place ([B, T, Hkv, Dh] views of the caches).
  using at::indexing::TensorIndex;
  cache.k.transpose(1, 2).index_put_({TensorIndex(idx), TensorIndex(lp)}, qk.second.squeeze(2).to(cache.k.scalar_type()));
  cache.v.transpose(1, 2).index_put_({TensorIndex(idx), TensorIndex(lp)}, v.squeeze(2).to(cache.v.scalar_type()));

  // Attention per run of consecutive processing samples, over views of their caches.
  const double scale = 1.0 / std::sqrt(static_cast<double>(Dh));
  std::vector<at::Tensor> outs;
  for (int64_t i = 0; i < P;) {
    int64_t j = i + 1, t = lp_host[i] + 1;
    bool equal = true;
    for (; j < P && sel[j] == sel[j - 1] + 1; ++j) {
      t = std::max(t, lp_host[j] + 1);
      equal = equal && lp_host[j] == lp_host[i];
    }
    const int64_t r = j - i;
    std::optional<at::Tensor> mask;  // each sample sees its own lp + 1 slots
    if (!equal) mask = (at::arange(t, lopts).unsqueeze(0) <= lp.narrow(0, i, r).unsqueeze(1)).view({r, 1, 1, t});
    outs.push_back(at::scaled_dot_product_attention(qk.first.narrow(0, i, r), cache.k.narrow(0, sel[i], r).narrow(2, 0, t),
                                                    cache.v.narrow(0, sel[i], r).narrow(2, 0, t), mask, 0.0, false,
                                                    scale, /*enable_gqa=*/H != Hkv));
    i = j;
  }
  auto o = outs.size() == 1 ? outs[0] : at::cat(outs, 0);  // [P, H, 1, Dh]
  auto a = hp + lora_linear(*self_attn->o_proj, o.transpose(1, 2).reshape({P, 1, H * Dh}));
  auto m = mlp->forward(post_attention_layernorm->forward(a));
  auto w = sc.weight.defined() ? (all ? sc.weight : sc.weight.index_select(0, idx)) : at::Tensor();
  auto y = combine(hp, a, m, w);
  cache.lengths = lengths + keep.to(at::kLong);
  return all ? y : h.index_copy(0, idx, y.to(h.scalar_type()));
}

}  // namespace gmod

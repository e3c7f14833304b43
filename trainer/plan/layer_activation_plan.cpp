// The decoder-layer activation terms of the memory plan (see layer_activation_plan.h).
#include "trainer/plan/layer_activation_plan.h"

#include <algorithm>

namespace gmod {

int64_t norm_saved(const PlanShape& s, int64_t T, bool rg_in, bool tw) {
  int64_t b = 0;
  if (rg_in) b += (s.fp32 ? s.e : 4) * s.B * T * s.D + 4 * s.B * T;
  if (tw) b += s.e * s.B * T * s.D;
  return b;
}

int64_t attn_mlp_saved(const PlanShape& s, int64_t T, bool rg, bool tw) {
  const int64_t BT = s.B * T;
  int64_t b = 0;
  if (tw) b += s.e * BT * s.D;                                               // q/k/v_proj input
  if (rg) b += s.e * BT * (2 * s.H + 2 * s.Hkv) * s.Dh + 4 * s.B * s.H * T;  // SDPA q, k, v, out, lse
  b += norm_saved(s, T, rg, tw);                                             // post_attention_layernorm(x)
  if (tw) b += s.e * BT * s.D;                                               // gate/up_proj input
  if (rg) b += 3 * s.e * BT * s.I;                                           // gate, silu(gate), up
  if (tw) b += s.e * BT * s.I;                                               // down_proj input
  return b;
}

int64_t dense_layer_saved(const PlanShape& s, bool rg_in, bool tw) {
  return norm_saved(s, s.L, rg_in, tw) + attn_mlp_saved(s, s.L, rg_in || tw, tw);
}

int64_t mod_layer_saved(const PlanShape& s, int64_t K, bool rg_in, bool tw, const LayerCosts& rc) {
  const int64_t BL = s.B * s.L, BK = s.B * K;
  int64_t b = 0;
  if (rc.router_reads_normed) {
    b += norm_saved(s, s.L, rg_in, tw);
    b += s.e * BL * s.D;                   // normed (gather_tokens' self)
    if (!s.fp32 && tw) b += 4 * BL * s.D;  // normed.to(fp32) for the router linear
  } else {
    if (rg_in && s.fp32) b += s.e * BL * s.D;  // h (gather's self; router input)
    if (!s.fp32 && tw && rc.learned_router) b += 4 * BL * s.D;  // h.to(fp32) for the router
    b += norm_saved(s, K, rg_in, tw);          // input_layernorm on the gathered tokens
  }
  if (rc.learned_router) b += 32 * BL;  // router logits/softmax [B,L,2], routing-loss terms [B,L] (fp32)
  b += 8 * BK;              // compaction index [B,K] int64 (gathers, scatter)
  b += 2 * s.e * K * s.Dh;  // cos/sin of the compacted positions [1,K,Dh]
  const bool rg = rg_in || tw;
  if (rc.router_reads_normed) {
    if (tw) b += s.e * BK * s.D;  // gathered normed tokens (q/k/v_proj input)
    if (rg) b += s.e * BK * (2 * s.H + 2 * s.Hkv) * s.Dh + 4 * s.B * s.H * K;
    b += norm_saved(s, K, rg, tw);
    if (tw) b += s.e * BK * s.D;
    if (rg) b += 3 * s.e * BK * s.I;
    if (tw) b += s.e * BK * s.I;
  } else {
    b += attn_mlp_saved(s, K, rg, tw);
  }
  if (rc.weighted_output) b += s.e * BK * s.D + 4 * BK;  // combine: m and the router weight (ws * m)
  return b;
}

int64_t layer_backward_transient(const PlanShape& s, int64_t T, bool tw) {
  const int64_t BT = s.B * T;
  const int64_t mlp = BT * s.D + std::max(BT * s.I + (tw ? s.D * s.I : 0), 2 * BT * s.I);
  const int64_t attn = 5 * BT * s.H * s.Dh + (tw ? s.D * s.H * s.Dh : 0) - 4 * BT * s.I - 2 * BT * s.D;
  return s.e * std::max(mlp, attn);
}

}  // namespace gmod

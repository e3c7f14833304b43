// The memory plan's decoder-layer activation terms (trainer/plan/memory_plan.h): what a dense or MoD decoder layer
// saves for its backward and what its backward adds on top, mirroring model/decoder_layer.cpp, model/layers.cpp and
// mod/mod_layer.cpp (the router kind's share from mod/layer_costs.h). Validated against measured peaks of real
// training steps (tests/trainer/mpi_memory_plan_test.cpp). The vision towers' terms: tower_activation_plan.h.
#pragma once

#include <cstdint>

#include "mod/layer_costs.h"

namespace gmod {

// Shapes of one step, shared by the activation terms: micro-batch B, sequence L, hidden D, MLP I, vocabulary V,
// heads H / Hkv of width Dh, bytes per element e of the compute dtype (fp32: whether that is fp32).
struct PlanShape {
  int64_t B, L, D, I, V, H, Hkv, Dh, e;
  bool fp32;
};

// RMSNorm (model/layers.cpp RMSNormImpl::forward) on T tokens per sample: xf = x.to(fp32) is x itself for
// fp32 (pow and the product save it) and a fresh fp32 copy otherwise; rsqrt [B,T,1] fp32; weight * xn saves
// xn (in the compute dtype) when the weight is trained.
int64_t norm_saved(const PlanShape& s, int64_t T, bool rg_in, bool tw);

// Attention + MLP of a pre-norm LLaMA layer on T tokens (model/decoder_layer.cpp, model/layers.cpp),
// excluding the input norm. The linears save their input only for the weight gradient; rotary saves only
// cos/sin (counted once); SDPA (fused causal kernel) saves q, k, v, its output (which o_proj reads as a view)
// and the fp32 logsumexp [B,H,T]; the MLP saves gate (silu), silu(gate) and up (product), and the product
// (down_proj, when trained).
int64_t attn_mlp_saved(const PlanShape& s, int64_t T, bool rg, bool tw);

// A dense decoder layer on all L tokens: its input norm, attention and MLP.
int64_t dense_layer_saved(const PlanShape& s, bool rg_in, bool tw);

// MoD layer (mod/mod_layer.cpp, γ-MoD shared router, top-k training): the input norm, the router and the
// gathers run on all L tokens; attention + MLP on the K processed ones.
// Other routers (mod/layer_costs.h) gather the layer input and norm the kept tokens; a router without parameters
// (PyramidDrop, FastV) keeps no router terms and combines without a weight.
int64_t mod_layer_saved(const PlanShape& s, int64_t K, bool rg_in, bool tw, const LayerCosts& rc);

// Transient of one decoder layer's backward beyond its saved tensors. The MLP's backward comes first: the
// incoming gradient [B,T,D] stays alive (the residual branch still needs it); down_proj's backward makes the
// product's gradient [B,T,I] and the weight gradient [D,I] (added in place by AccumulateGrad, then freed);
// the product's backward makes the silu and up gradients while freeing the saved product, so 2 [B,T,I] on
// top. The attention's backward comes after the MLP's saved tensors (4 [B,T,I] + 2 [B,T,D]) are gone and only
// matters for narrow MLPs.
int64_t layer_backward_transient(const PlanShape& s, int64_t T, bool tw);

}  // namespace gmod

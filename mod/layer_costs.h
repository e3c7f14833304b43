// What a MoD layer of each router kind costs in training beyond a dense layer on its kept tokens, for the memory
// plan and the parameter counts (trainer/plan): the router's parameters, and which tensors the layer keeps for the
// backward. The planner asks these instead of naming routers; each method states its costs in its file pair
// (TokenSelector::layer_costs, mod/select_*.h) and `gmod plan` follows. Measured against the real layers by tests/trainer/mpi_memory_plan_test.cpp.
#pragma once

#include <cstdint>

#include "mod/mod_config.h"

namespace gmod {

struct LayerCosts {
  int64_t shared_router_params = 0;  // once per model, whatever the number of MoD layers (γ-MoD's [2, D])
  int64_t layer_router_params = 0;   // per MoD layer (a per-layer router [1, D]; p-MoD's weight [1, D] and bias)
  // The router reads the input norm of all L tokens (γ-MoD): the norm runs on all of them and its output is what
  // the layer gathers; otherwise the layer gathers its input and norms the K kept tokens.
  bool router_reads_normed = false;
  // A learned router: its input cast to fp32 (bf16 runs), its logits / softmax and the routing-loss terms [B, L]
  // kept for the backward. False for parameter-free rankings (PyramidDrop, FastV: no gradient through them).
  bool learned_router = true;
  // The layer's output is scaled by the router weight: the combine keeps the MLP output and the weight.
  bool weighted_output = true;
};

// The costs of the method registered for `kind` (mod/method_registry.h); p-MoD's with its router bias on (its
// default).
LayerCosts layer_costs(RouterKind kind, int64_t hidden);

}  // namespace gmod

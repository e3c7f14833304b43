// What each router kind costs in training (see layer_costs.h).
#include "mod/layer_costs.h"

namespace gmod {

LayerCosts layer_costs(RouterKind kind, int64_t hidden) {
  LayerCosts c;
  switch (kind) {
    case RouterKind::kGammaShared:  // mod_router.weight [2, D], shared by every MoD layer (mod/router.h)
      c.shared_router_params = 2 * hidden;
      c.router_reads_normed = true;
      break;
    case RouterKind::kPerLayer:  // llm.layers.{i}.router.weight [1, D]
      c.layer_router_params = hidden;
      break;
    case RouterKind::kPMoD:  // llm.layers.{i}.router.{weight [1, D], bias [1]} (mod/pmod.h)
      c.layer_router_params = hidden + 1;
      break;
    case RouterKind::kAttention:  // scores from the previous layer's attention; weight from them (mod/router.h)
      break;
    case RouterKind::kFastV:  // parameter-free rankings without gradient, no router weight
    case RouterKind::kPDrop:
      c.learned_router = false;
      c.weighted_output = false;
      break;
  }
  return c;
}

}  // namespace gmod

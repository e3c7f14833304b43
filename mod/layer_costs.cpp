// What each router kind costs in training (see layer_costs.h): its method says (TokenSelector::layer_costs).
#include "mod/layer_costs.h"

#include "mod/method_registry.h"
#include "mod/token_selection.h"

namespace gmod {

LayerCosts layer_costs(RouterKind kind, int64_t hidden) { return method_for(kind).layer_costs(hidden); }

}  // namespace gmod

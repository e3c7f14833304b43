#include "mod/select_fastv.h"

#include <stdexcept>

#include "mod/fastv.h"
#include "mod/method_registry.h"

namespace gmod {

RoutingMasks FastVSelector::masks(const MoDDecoderLayer& layer, const ForwardState& st, int64_t B, int64_t L,
                                  at::Device device, int layer_idx, bool topk) const {
  auto m = TokenSelector::masks(layer, st, B, L, device, layer_idx, topk);
  image_tokens_routable(m, st);
  return m;
}

at::Tensor FastVSelector::select(RoutingStep& s) const {
  if (!s.st.routing_scores.defined())
    throw std::logic_error("FastV layer " + std::to_string(s.layer_idx) +
                           ": no scores from layer fastv_k - 1 (convert_to_mod sets that layer up)");
  return fastv_selection(s.st.routing_scores, s.st.token_roles, s.masks.valid, s.layer.cfg.fastv_r);
}

MoDConfig FastVSelector::config_from_spec(const std::string& spec, int num_layers) const {
  return parse_fastv(spec, num_layers);
}

GMOD_REGISTER_METHOD(fastv, FastVSelector)

}  // namespace gmod

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

void FastVSelector::check_layers(const MoDConfig& c, int num_layers, std::ostream& err) const {
  if (c.fastv_k < 1 || c.fastv_k >= num_layers)
    err << "\n  fastv_k = " << c.fastv_k << ", expected [1, " << num_layers
        << "): FastV scores the image tokens at layer fastv_k - 1 and prunes from layer fastv_k on";
  if (!(c.fastv_r >= 0.0 && c.fastv_r <= 1.0)) err << "\n  fastv_r = " << c.fastv_r << ", expected [0, 1]";
  bool tail = c.fastv_k >= 1 && c.fastv_k < num_layers && static_cast<int>(c.mod_layers.size()) == num_layers - c.fastv_k;
  for (size_t i = 0; tail && i < c.mod_layers.size(); ++i) tail = c.mod_layers[i] == c.fastv_k + static_cast<int>(i);
  if (!tail)
    err << "\n  router fastv: mod_layers_idx must be every layer from fastv_k = " << c.fastv_k << " to "
        << num_layers - 1;
  if (c.rope_positions != RopePositions::kOriginal)
    err << "\n  router fastv: rope_positions must be \"original\" (FastV keeps the tokens' positions)";
}

MoDConfig FastVSelector::config_from_spec(const std::string& spec, int num_layers) const {
  return parse_fastv(spec, num_layers);
}

GMOD_REGISTER_METHOD(fastv, FastVSelector)

}  // namespace gmod

#include "mod/select_pdrop.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "mod/method_registry.h"
#include "mod/pdrop.h"
#include "model/segments.h"

namespace gmod {

RoutingMasks PDropSelector::masks(const MoDDecoderLayer& layer, const ForwardState& st, int64_t B, int64_t L,
                                  at::Device device, int layer_idx, bool topk) const {
  auto m = TokenSelector::masks(layer, st, B, L, device, layer_idx, topk);
  image_tokens_routable(m, st);
  return m;
}

at::Tensor PDropSelector::select(RoutingStep& s) const {
  // The tokens still in the sequence; a stage boundary ranks and narrows them.
  const auto& st = s.st;
  const auto& masks = s.masks;
  const auto& cfg = s.layer.cfg;
  const auto present = st.routing_scores.defined() ? masks.valid & at::isfinite(st.routing_scores) : masks.valid;
  if (!st.routing_scores.defined() && !pdrop_boundary(cfg, s.layer_idx))
    throw std::logic_error("PyramidDrop layer " + std::to_string(s.layer_idx) +
                           ": no stage state from the layers before (the first MoD layer must be pdrop_layers[0])");
  if (!pdrop_boundary(cfg, s.layer_idx)) return present;
  if (!s.packed) return pdrop_rank(s.layer, s.h, st, present, s.layer_idx);
  // Each sample ranked alone: the ranking on the segment-major view, written back to the rows.
  const auto& vi = st.segment_index;
  ForwardState sv;
  sv.rope = st.rope;
  sv.token_roles = st.token_roles.defined() ? to_segment_view(st.token_roles, vi) : at::Tensor();
  sv.key_valid = s.seg_masks.valid;
  sv.positions = to_segment_view(st.positions.expand({s.B, s.L}), vi);
  if (st.mrope_positions.defined()) {  // 3-D positions: the full tables' rows per segment (mod/kept_positions.h)
    sv.mrope_positions = to_segment_view(st.mrope_positions.permute({1, 2, 0}), vi).permute({2, 0, 1});
    sv.cos = to_segment_view(st.cos, vi);
    sv.sin = to_segment_view(st.sin, vi);
  }
  const auto kept = pdrop_rank(s.layer, to_segment_view(s.h, vi), sv, to_segment_view(present, vi) & st.segment_slots,
                               s.layer_idx);
  return from_segment_view(kept, vi, st.segment_slots, at::zeros_like(masks.valid));
}

void PDropSelector::after_select(RoutingStep& s, const at::Tensor& sel) const {
  // The stage state for the next layers: 0 on the tokens still in the sequence, -inf on dropped ones.
  const auto opts = s.h.options().dtype(at::kFloat);
  s.st.routing_scores =
      at::where(sel, at::zeros({}, opts), at::full({}, -std::numeric_limits<double>::infinity(), opts));
}

void PDropSelector::apply_defaults(const nlohmann::json& j, MoDConfig& c) const {
  if (!j.contains("router_aux_loss_coef")) c.router_aux_loss_coef = 0.0;
}

MoDConfig PDropSelector::run_rule_config(const std::string& rule, const MoDConfig& base, int num_layers) const {
  MoDConfig c = parse_pdrop(rule.substr(6), num_layers);
  // mod.config with router pdrop: its settings the rule does not carry (rope_positions "original" is what an
  // M-RoPE model needs; the default stays the original's "compacted").
  if (base.router == kind()) {
    c.pdrop_unanswered = base.pdrop_unanswered;
    c.rope_positions = base.rope_positions;
  }
  return c;
}

std::optional<MoDConfig> PDropSelector::layers_from_config(const MoDConfig& base, int num_layers) const {
  MoDConfig c = base;
  if (!c.pdrop_layers.empty())
    for (int i = std::max(c.pdrop_layers.front(), 0); i < num_layers; ++i) c.mod_layers.push_back(i);
  validate(c, num_layers, "mod.config (router pdrop)");
  return c;
}

MoDConfig PDropSelector::config_from_spec(const std::string& spec, int num_layers) const {
  return parse_pdrop(spec, num_layers);
}

GMOD_REGISTER_METHOD(pdrop, PDropSelector)

}  // namespace gmod

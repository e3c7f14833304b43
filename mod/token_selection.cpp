#include "mod/token_selection.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "mod/routing_rule.h"
#include "model/segments.h"
#include "model/token_roles.h"

namespace gmod {

void TokenSelector::attach(MoDDecoderLayer&, const DenseDecoderLayer&, int) const {}

std::vector<at::Tensor> TokenSelector::external_parameters(const MoDDecoderLayer&) const { return {}; }

RoutingMasks TokenSelector::masks(const MoDDecoderLayer& layer, const ForwardState& st, int64_t B, int64_t L,
                                  at::Device device, int, bool) const {
  return routing_masks(st.token_roles, st.key_valid, B, L, layer.cfg.forced_keep, device);
}

MoDDecoderLayer::Scores TokenSelector::score(const MoDDecoderLayer&, const at::Tensor&) const { return {}; }

void TokenSelector::capacity(const MoDDecoderLayer& layer, const at::Tensor& host_counts, const RoutingMasks& cap_masks,
                             const RoutingMasks&, bool, HostCapacity& plan, at::Tensor& k_dev) const {
  plan = host_capacity(host_counts, layer.cfg.skip_frac, layer.cfg.forced_keep, /*all_routable=*/false);
  k_dev = topk_capacity(cap_masks, layer.cfg.skip_frac);  // the same values on the device, without a copy
}

int64_t TokenSelector::shared_kmax(const MoDDecoderLayer& layer, const at::Tensor& host_counts) const {
  if (!capacity_driven(layer.uses_topk()) || layer.forced_selection.defined()) return -1;
  return host_capacity(host_counts, layer.cfg.skip_frac, layer.cfg.forced_keep, /*all_routable=*/false).kmax;
}

void TokenSelector::after_select(RoutingStep&, const at::Tensor&) const {}

at::Tensor TokenSelector::aux_loss(const RoutingStep& s, const at::Tensor& sel) const {
  if (!s.sc.logits.defined() || !s.topk) return at::Tensor();
  return routing_loss(s.sc.logits, sel, s.masks.valid);
}

at::Tensor TokenSelector::combine(const MoDConfig& cfg, const at::Tensor& x, const at::Tensor& a, const at::Tensor& m,
                                  const at::Tensor& w) const {
  if (!cfg.scale_by_router || !w.defined()) return a + m;
  auto ws = w.to(m.scalar_type()).unsqueeze(-1);
  return x + ws * ((a - x) + m);  // the whole block delta (Raposo)
}

MoDDecoderLayer::Scores TokenSelector::decode_scores(const MoDDecoderLayer& layer, const at::Tensor& h) const {
  return score(layer, h);
}

MoDConfig TokenSelector::config_from_spec(const std::string&, int) const {
  throw std::logic_error(std::string(display_name()) + " has no inference flag");
}

void TokenSelector::save_original_layout(const MultimodalLM&, const MoDConfig&, const std::string&) const {
  throw std::logic_error(std::string(display_name()) + " has no original checkpoint layout to export");
}

MoDConfig TokenSelector::rule_config(const std::string& rule, int, const ConvertChoices&) const {
  throw std::logic_error(std::string(display_name()) + " has no conversion rule (" + rule + ")");
}

std::shared_ptr<DecoderBlock> TokenSelector::scoring_layer(const MoDConfig&, const DenseDecoderLayer&) const {
  throw std::logic_error(std::string(display_name()) + " has no scoring layer");
}

MoDConfig TokenSelector::run_rule_config(const std::string& rule, const MoDConfig&, int) const {
  throw std::logic_error(std::string(display_name()) + " has no run rule (" + rule + ")");
}

void TokenSelector::convert_flag_keys(nlohmann::json& j) const { j["router"] = name(); }

at::Tensor combine_mlp_delta(const MoDConfig& cfg, const at::Tensor& a, const at::Tensor& m, const at::Tensor& w) {
  if (!cfg.scale_by_router || !w.defined()) return a + m;
  auto ws = w.to(m.scalar_type()).unsqueeze(-1);
  return a + ws * m;
}

at::Tensor select_by_capacity(RoutingStep& s, const at::Tensor& score) {
  at::Tensor sel;
  if (s.packed) {  // each segment's top k_s among its own tokens, written back to [B, L]
    const auto seg = select_topk(to_segment_view(score, s.st.segment_index), s.seg_masks, s.k_dev, s.plan.kmax);
    sel = from_segment_view(seg, s.st.segment_index, s.st.segment_slots,
                            at::zeros({score.size(0), score.size(1)}, seg.options()));
  } else {
    sel = select_topk(score, s.masks, s.k_dev, s.plan.kmax);
  }
  if (s.layer.record_selection) s.layer.recorded_keys.push_back(topk_key(score, s.masks));
  return sel;
}

at::Tensor select_by_threshold(RoutingStep& s, double thr) {
  const auto& masks = s.masks;
  const auto& kp = s.sc.keep_prob;
  if (s.layer.cfg.adaptive_threshold == AdaptiveThreshold::kNone) return masks.forced | (masks.routable & (kp > thr));
  // mod/routing_rule.h; compared in keep_prob's dtype as the static threshold is
  const auto thr_b = routing_thresholds(s.layer.cfg, s.layer_idx, thr, masks.valid.sum(1)).unsqueeze(1);  // [B, 1]
  return masks.forced | (masks.routable & (kp > thr_b.to(kp.scalar_type())));
}

void refuse_router_options(const TokenSelector& method, const std::string& rule, const ConvertChoices& given) {
  if (given.flag || given.adaptive)
    throw std::invalid_argument("--rule " + rule + ": " + method.display_name() +
                                " has no router, so no --direct or --adaptive-threshold");
}

void image_tokens_routable(RoutingMasks& m, const ForwardState& st) {
  if (!st.token_roles.defined()) return;
  m.routable = m.valid & (st.token_roles == static_cast<int64_t>(TokenRole::kImage));
  m.forced = m.valid & m.routable.logical_not();
}

}  // namespace gmod

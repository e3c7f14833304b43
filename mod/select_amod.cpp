#include "mod/select_amod.h"

#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "mod/method_registry.h"
#include "model/segments.h"

namespace gmod {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
bool all_routable(const MoDConfig& cfg) { return cfg.amod_routable == AmodRoutable::kAll; }
}  // namespace

RoutingMasks AttentionSelector::masks(const MoDDecoderLayer& layer, const ForwardState& st, int64_t B, int64_t L,
                                      at::Device device, int, bool) const {
  return routing_masks(st.token_roles, st.key_valid, B, L, layer.cfg.forced_keep, device, all_routable(layer.cfg));
}

void AttentionSelector::capacity(const MoDDecoderLayer& layer, const at::Tensor& host_counts,
                                 const RoutingMasks& cap_masks, const RoutingMasks&, bool, HostCapacity& plan,
                                 at::Tensor& k_dev) const {
  plan = host_capacity(host_counts, layer.cfg.skip_frac, layer.cfg.forced_keep, all_routable(layer.cfg));
  k_dev = topk_capacity(cap_masks, layer.cfg.skip_frac);  // the same values on the device, without a copy
}

int64_t AttentionSelector::shared_kmax(const MoDDecoderLayer& layer, const at::Tensor& host_counts) const {
  if (layer.forced_selection.defined()) return -1;
  return host_capacity(host_counts, layer.cfg.skip_frac, layer.cfg.forced_keep, all_routable(layer.cfg)).kmax;
}

at::Tensor AttentionSelector::select(RoutingStep& s) const {
  if (!s.st.routing_scores.defined())
    throw std::logic_error("A-MoD layer " + std::to_string(s.layer_idx) +
                           ": no routing scores from the previous layer (convert_to_mod sets that layer up)");
  return select_by_capacity(s, s.st.routing_scores);
}

void AttentionSelector::carry_empty(const MoDDecoderLayer& layer, ForwardState& st, int64_t B, int64_t L,
                                    const at::Tensor& h) const {
  if (layer.emit_scores && layer.cfg.amod_skipped == AmodSkippedScore::kForceKeep)
    st.routing_scores = at::full({B, L}, kInf, h.options().dtype(at::kFloat));
}

void AttentionSelector::carry(const MoDDecoderLayer& layer, ForwardState& st, const Compaction& c,
                              const AttentionSide& side, const SegmentLayout* kept_layout, int64_t B, int64_t L,
                              const at::Tensor& h) const {
  if (!layer.emit_scores) return;
  // Consecutive A-MoD layers (adaptation): scores of the processed tokens, the others per amod_skipped.
  const auto& cfg = layer.cfg;
  at::NoGradGuard no_grad;
  at::Tensor s;  // [B, K]
  if (kept_layout) {
    const auto [ki, ks] = kept_layout->view_index(c.kmax, h.device());
    s = segment_column_scores(side.q, side.k, ki, ks, cfg.amod_causal_normalise);
  } else {
    s = attention_column_scores(side.q, side.k, c.valid, cfg.amod_causal_normalise, 128, side.lse);
  }
  auto base = (cfg.amod_skipped == AmodSkippedScore::kCarry && st.routing_scores.defined())
                  ? st.routing_scores.to(at::kFloat)
                  : at::full({B, L}, kInf, h.options().dtype(at::kFloat));
  st.routing_scores = base.scatter(1, c.index, at::where(c.valid, s, base.gather(1, c.index)));
}

TokenSelector::KernelUse AttentionSelector::deterministic_use(const MoDConfig& cfg) const {
  if (!cfg.amod_causal_normalise) return {};
  return {"A-MoD's causal column normalisation (mod/router.cpp)", "float cumsum", "mod.amod_causal_normalise false"};
}

void AttentionSelector::convert_flag_keys(nlohmann::json& j) const {
  j["router"] = name();
  j["amod_routable"] = to_string(AmodRoutable::kRoles);
  j["amod_skipped"] = to_string(AmodSkippedScore::kCarry);
}

GMOD_REGISTER_METHOD(attention, AttentionSelector)

}  // namespace gmod

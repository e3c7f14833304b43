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

void AttentionSelector::check_layers(const MoDConfig& c, int, std::ostream& err) const {
  if (c.is_mod_layer(0))
    err << "\n  router attention (A-MoD) needs the previous layer's attention map, so layer 0 cannot be MoD";
  if (c.amod_skipped == AmodSkippedScore::kInterleaved)
    for (size_t i = 1; i < c.mod_layers.size(); ++i)
      if (c.mod_layers[i] == c.mod_layers[i - 1] + 1)
        err << "\n  A-MoD layers " << c.mod_layers[i - 1] << " and " << c.mod_layers[i]
            << " are consecutive: layer " << c.mod_layers[i]
            << " would have no full attention map to route by (A-MoD interleaves MoD and dense layers); choose "
               "interleaved layers or set amod_skipped to \"carry\" or \"force_keep\" (adaptations)";
}

std::shared_ptr<DecoderBlock> AttentionSelector::scoring_layer(const MoDConfig& cfg,
                                                               const DenseDecoderLayer& dense) const {
  return std::make_shared<AttentionScoringLayer>(dense, cfg.amod_causal_normalise);
}

void AttentionSelector::convert_flag_keys(nlohmann::json& j) const {
  j["router"] = name();
  j["amod_routable"] = to_string(AmodRoutable::kRoles);
  j["amod_skipped"] = to_string(AmodSkippedScore::kCarry);
}

GMOD_REGISTER_METHOD(attention, AttentionSelector)

}  // namespace gmod

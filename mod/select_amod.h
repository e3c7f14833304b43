// A-MoD (config router "attention"): parameter-free; a MoD layer ranks its tokens by the column means of the
// previous layer's attention (ForwardState::routing_scores, left by an AttentionScoringLayer or, for consecutive
// A-MoD layers, by the previous A-MoD layer: amod_skipped "carry" / "force_keep"), at the capacity top-k in
// training and at inference alike; every valid token is routable (amod_routable "all", the paper) or only the
// γ-MoD routable roles ("roles"); no output weight, no auxiliary loss.
#pragma once

#include "mod/token_selection.h"

namespace gmod {

class AttentionSelector : public TokenSelector {
 public:
  const char* name() const override { return "attention"; }
  RouterKind kind() const override { return RouterKind::kAttention; }
  const char* display_name() const override { return "A-MoD"; }
  // Layer 0 has no previous attention map; consecutive MoD layers only with amod_skipped carry / force_keep.
  void check_layers(const MoDConfig& c, int num_layers, std::ostream& err) const override;
  // Scores from the previous layer's attention, the weight from them (mod/router.h): no parameters.
  LayerCosts layer_costs(int64_t) const override { return {}; }
  bool scores_for_next(const MoDConfig& cfg, int layer_idx) const override { return cfg.is_mod_layer(layer_idx + 1); }
  std::shared_ptr<DecoderBlock> scoring_layer(const MoDConfig& cfg, const DenseDecoderLayer& dense) const override;
  RoutingMasks masks(const MoDDecoderLayer& layer, const ForwardState& st, int64_t B, int64_t L, at::Device device,
                     int layer_idx, bool topk) const override;
  bool capacity_driven(bool) const override { return true; }
  void capacity(const MoDDecoderLayer& layer, const at::Tensor& host_counts, const RoutingMasks& cap_masks,
                const RoutingMasks& masks, bool topk, HostCapacity& plan, at::Tensor& k_dev) const override;
  int64_t shared_kmax(const MoDDecoderLayer& layer, const at::Tensor& host_counts) const override;
  at::Tensor select(RoutingStep& s) const override;
  bool wants_attention_side(const MoDDecoderLayer& layer) const override { return layer.emit_scores; }
  void carry_empty(const MoDDecoderLayer& layer, ForwardState& st, int64_t B, int64_t L,
                   const at::Tensor& h) const override;
  void carry(const MoDDecoderLayer& layer, ForwardState& st, const Compaction& c, const AttentionSide& side,
             const SegmentLayout* kept_layout, int64_t B, int64_t L, const at::Tensor& h) const override;
  KernelUse deterministic_use(const MoDConfig& cfg) const override;
  // Direct γ-MoD (the γ-MoD rebuttal to reviewer 6GUt), gmod convert --direct: no trained router; the routable
  // tokens (image ∪ system) that receive the least attention in the previous layer are skipped (A-MoD scores,
  // carried across consecutive MoD layers), skip_frac of them, in the layers the rule picks.
  ConvertFlag convert_flag() const override {
    return {"--direct",
            "Direct γ-MoD: no trained router, skip the routable tokens that get the least attention in the previous "
            "layer (router attention, amod_routable roles, amod_skipped carry)"};
  }
  void convert_flag_keys(nlohmann::json& j) const override;
};

}  // namespace gmod

// FastV's MoD layers (config router "fastv"; the method and its scoring layer: mod/fastv.h): parameter-free; every
// layer from fastv_k on processes the non-image tokens and the round(n_img·(1 - fastv_r)) image tokens layer
// fastv_k - 1 scored highest (ForwardState::routing_scores); the same rule in training and at inference, never the
// capacity top-k; unpacked batches only.
#pragma once

#include "mod/fastv.h"
#include "mod/token_selection.h"

namespace gmod {

class FastVSelector : public TokenSelector {
 public:
  const char* name() const override { return "fastv"; }
  RouterKind kind() const override { return RouterKind::kFastV; }
  const char* display_name() const override { return "FastV"; }
  // fastv_k and fastv_r in range; its layers are exactly [fastv_k, num_layers) at their original positions.
  void check_layers(const MoDConfig& c, int num_layers, std::ostream& err) const override;
  // A parameter-free ranking without gradient, no router weight.
  LayerCosts layer_costs(int64_t) const override {
    LayerCosts c;
    c.learned_router = false;
    c.weighted_output = false;
    return c;
  }
  // Layer fastv_k - 1 scores: dense, it leaves the last row's attention.
  bool scores_for_next(const MoDConfig& cfg, int layer_idx) const override { return layer_idx == cfg.fastv_k - 1; }
  std::shared_ptr<DecoderBlock> scoring_layer(const MoDConfig&, const DenseDecoderLayer& dense) const override {
    return std::make_shared<FastVScoringLayer>(dense);
  }
  bool uses_topk_mode() const override { return false; }
  bool routes_packed() const override { return false; }
  bool capacity_driven(bool) const override { return false; }
  RoutingMasks masks(const MoDDecoderLayer& layer, const ForwardState& st, int64_t B, int64_t L, at::Device device,
                     int layer_idx, bool topk) const override;
  at::Tensor select(RoutingStep& s) const override;
  InferenceFlag inference_flag() const override {
    return {"--fastv", "K:R",
            "FastV on a dense model: from layer K on, drop the fraction R of each sample's image tokens that the "
            "last prompt token attends to least at layer K-1 (e.g. 2:0.5)"};
  }
  MoDConfig config_from_spec(const std::string& spec, int num_layers) const override;
  // gmod convert --rule fastv:K:R: every layer from K on, no router.
  bool owns_rule(const std::string& rule) const override { return rule.rfind("fastv:", 0) == 0; }
  std::string rule_help() const override {
    return "fastv:K:R (FastV: from layer K on drop the fraction R of the image tokens)";
  }
  void check_convert_options(const std::string& rule, const ConvertChoices& given) const override {
    refuse_router_options(*this, rule, given);
  }
  bool rule_checked_before_weights() const override { return true; }
  MoDConfig rule_config(const std::string& rule, int num_layers, const ConvertChoices&) const override {
    return parse_fastv(rule.substr(6), num_layers);
  }
};

}  // namespace gmod

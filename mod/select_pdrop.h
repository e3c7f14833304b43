// PyramidDrop's MoD layers (config router "pdrop"; the method, its ranking and config: mod/pdrop.h):
// parameter-free; image tokens only are routable; a stage boundary layer ranks the tokens still in the sequence by
// the last instruction token's attention and keeps its stage's share, the other layers of a stage process what
// is left; never the capacity top-k. Carries the stage state to the next layers in ForwardState::routing_scores
// (0 on the tokens still in the sequence, -inf on dropped ones).
#pragma once

#include "mod/pdrop.h"
#include "mod/token_selection.h"

namespace gmod {

class PDropSelector : public TokenSelector {
 public:
  const char* name() const override { return "pdrop"; }
  RouterKind kind() const override { return RouterKind::kPDrop; }
  bool layers_from_rule() const override { return true; }
  const char* display_name() const override { return "PyramidDrop"; }
  // Its stages and ratios, and mod_layers_idx = every layer from the first stage on (validate_pdrop, mod/pdrop.h).
  void check_section(const MoDConfig& c, int num_layers, std::ostream& err) const override {
    validate_pdrop(c, num_layers, err);
  }
  // Parameter-free: no routing loss.
  void apply_defaults(const nlohmann::json& j, MoDConfig& c) const override;
  // A parameter-free ranking without gradient, no router weight.
  LayerCosts layer_costs(int64_t) const override {
    LayerCosts c;
    c.learned_router = false;
    c.weighted_output = false;
    return c;
  }
  // mod.rule "pdrop:LAYERS:RATIOS": its stages and ratios, with mod.config's other PyramidDrop fields.
  bool trains_by_rule(const std::string& rule) const override { return is_pdrop_rule(rule); }
  MoDConfig run_rule_config(const std::string& rule, const MoDConfig& base, int num_layers) const override;
  // mod.config names its stages: every layer from the first on.
  std::optional<MoDConfig> layers_from_config(const MoDConfig& base, int num_layers) const override;
  bool uses_topk_mode() const override { return false; }
  bool capacity_driven(bool) const override { return false; }
  RoutingMasks masks(const MoDDecoderLayer& layer, const ForwardState& st, int64_t B, int64_t L, at::Device device,
                     int layer_idx, bool topk) const override;
  at::Tensor select(RoutingStep& s) const override;
  void after_select(RoutingStep& s, const at::Tensor& sel) const override;
  InferenceFlag inference_flag() const override {
    return {"--pdrop", "LAYERS:RATIOS",
            "PyramidDrop on a dense model (training-free): stage s from layer LAYERS[s] on keeps RATIOS[s] of each "
            "sample's image tokens, those the last prompt token attends to most at the stage's first layer (e.g. "
            "8,16,24:0.5,0.25,0.125)"};
  }
  MoDConfig config_from_spec(const std::string& spec, int num_layers) const override;
  // gmod convert --rule pdrop:LAYERS:RATIOS: every layer from its first stage on, no router.
  bool owns_rule(const std::string& rule) const override { return is_pdrop_rule(rule); }
  std::string rule_help() const override {
    return "pdrop:LAYERS:RATIOS (PyramidDrop: stage s from layer LAYERS[s] on keeps RATIOS[s] of the image tokens, "
           "e.g. pdrop:8,16,24:0.5,0.25,0.125)";
  }
  void check_convert_options(const std::string& rule, const ConvertChoices& given) const override {
    refuse_router_options(*this, rule, given);
  }
  bool rule_checked_before_weights() const override { return true; }
  MoDConfig rule_config(const std::string& rule, int num_layers, const ConvertChoices&) const override {
    return parse_pdrop(rule.substr(6), num_layers);
  }
  std::optional<double> image_keep_ratio(const MoDConfig& cfg, int layer, int) const override {
    return pdrop_ratio(cfg, layer);
  }
};

}  // namespace gmod

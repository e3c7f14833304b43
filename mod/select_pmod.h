// p-MoD's MoD layers (config router "pmod"; the method, its schedule, router and config: mod/pmod.h): image tokens
// only are routable; each layer keeps the top trunc(n_img·ratio_l) image tokens by its TanhNorm weight w, in
// training and at inference (pmod_capacity, from the host counts); skipped image tokens leave as w·x, kept ones
// as a + w·MLP; text tokens unscaled; no auxiliary loss; every decode token (text) is processed.
#pragma once

#include "mod/pmod.h"
#include "mod/token_selection.h"

namespace gmod {

class PModSelector : public TokenSelector {
 public:
  const char* name() const override { return "pmod"; }
  RouterKind kind() const override { return RouterKind::kPMoD; }
  bool layers_from_rule() const override { return true; }
  const char* display_name() const override { return "p-MoD"; }
  // Its schedule's fields, and mod_layers_idx = the layers the schedule routes (validate_pmod, mod/pmod.h).
  void check_section(const MoDConfig& c, int num_layers, std::ostream& err) const override {
    validate_pmod(c, num_layers, err);
  }
  // Original positions, zero router init (the official script's mod_special_init), no routing loss.
  void apply_defaults(const nlohmann::json& j, MoDConfig& c) const override;
  // llm.layers.{i}.router.{weight [1, D], bias [1]} (mod/pmod.h), with the bias on (the default).
  LayerCosts layer_costs(int64_t hidden) const override {
    LayerCosts c;
    c.layer_router_params = hidden + 1;
    return c;
  }
  void place(MoDDecoderLayer& layer, const MoDConfig& cfg, int layer_idx, int num_layers) const override {
    layer.pmod_ratio = pmod_ratio(cfg, layer_idx, num_layers);
  }
  // mod.rule "pmod" / "pmod:official_31" (pmod_rule_config).
  bool trains_by_rule(const std::string& rule) const override { return is_pmod_rule(rule); }
  MoDConfig run_rule_config(const std::string& rule, const MoDConfig& base, int num_layers) const override {
    return pmod_rule_config(rule, base, num_layers);
  }
  void attach(MoDDecoderLayer& layer, const DenseDecoderLayer& dense, int layer_idx) const override;
  RoutingMasks masks(const MoDDecoderLayer& layer, const ForwardState& st, int64_t B, int64_t L, at::Device device,
                     int layer_idx, bool topk) const override;
  MoDDecoderLayer::Scores score(const MoDDecoderLayer& layer, const at::Tensor& h) const override;
  bool capacity_driven(bool) const override { return true; }
  void capacity(const MoDDecoderLayer& layer, const at::Tensor& host_counts, const RoutingMasks& cap_masks,
                const RoutingMasks& masks, bool topk, HostCapacity& plan, at::Tensor& k_dev) const override;
  // A different image-token ratio per layer: no plan shared by the layers (they count for themselves).
  int64_t shared_kmax(const MoDDecoderLayer&, const at::Tensor&) const override { return -1; }
  at::Tensor select(RoutingStep& s) const override;
  at::Tensor skipped(RoutingStep& s) const override;
  at::Tensor combine(const MoDConfig& cfg, const at::Tensor& x, const at::Tensor& a, const at::Tensor& m,
                     const at::Tensor& w) const override;
  MoDDecoderLayer::Scores decode_scores(const MoDDecoderLayer&, const at::Tensor&) const override { return {}; }
  // The original MCG-NJU/p-MoD layout (pmod_llava_llama, mod/pmod_checkpoint.h).
  const char* original_layout_flag() const override { return "--pmod-original"; }
  std::string original_layout_help() const override {
    return "write a p-MoD model in the original MCG-NJU/p-MoD code's layout (pmod_llava_llama) instead of gmod's";
  }
  void save_original_layout(const MultimodalLM& model, const MoDConfig& cfg, const std::string& out) const override;
  // gmod convert --rule pmod[:official_31]: the layers its ratio schedule routes, with its router and defaults (zero-
  // initialised routers unless --router-init says otherwise, no routing loss); official_31 is the original code's
  // hard-coded denominator.
  bool owns_rule(const std::string& rule) const override { return rule == "pmod" || rule.rfind("pmod:", 0) == 0; }
  std::string rule_help() const override {
    return "pmod (p-MoD: the layers its ratio schedule routes; pmod:official_31 with the original code's denominator "
           "31)";
  }
  void check_convert_options(const std::string& rule, const ConvertChoices& given) const override;
  MoDConfig rule_config(const std::string& rule, int num_layers, const ConvertChoices& given) const override;
  std::optional<double> image_keep_ratio(const MoDConfig& cfg, int layer, int num_layers) const override;
};

}  // namespace gmod

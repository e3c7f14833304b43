// Turning a dense MultimodalLM into a Mixture-of-Depths one: which layers to convert (rules on
// per-layer ARank) and the model surgery itself.
//
// Rules (parse_conversion_rule accepts the strings in brackets):
//   threshold   ["threshold:110"]   layers with ARank < τ become MoD (paper Fig. 2)
//   keep_top    ["keep_top:4"]      the k highest-ARank layers stay dense, the rest become MoD (issue #5)
//   explicit    ["layers:3,4,5"]    exactly these layers
//   arank_mod   ["arank_mod"]       official code: layers {0, 1, 2, last} dense, every other layer MoD
//
// Parameter names after conversion: the converted layers keep llm.layers.{i}.{self_attn,mlp,
// input_layernorm,post_attention_layernorm}.*; the γ-MoD shared router appears once as
// "mod_router.weight" [2, D] (an HF export writes it as model.layers.{i}.router.weight for every MoD
// layer i, all equal); per-layer routers are "llm.layers.{i}.router.weight" [1, D]; A-MoD has none.
#pragma once

#include <string>
#include <vector>

#include "model/llava.h"
#include "mod/mod_layer.h"

namespace gmod {

struct ConversionRule {
  enum class Kind { kThreshold, kKeepTop, kExplicit, kArankMod } kind = Kind::kArankMod;
  double tau = 0.0;         // kThreshold
  int keep_top = 4;         // kKeepTop
  std::vector<int> layers;  // kExplicit
  std::string to_string() const;
};
ConversionRule parse_conversion_rule(const std::string& s);

// Sorted MoD layer indices for a model with `num_layers` layers. `arank` (one value per layer) is
// needed by kThreshold and kKeepTop; ties in kKeepTop keep the lower layer index dense.
std::vector<int> select_mod_layers(const ConversionRule& rule, int num_layers, const std::vector<double>& arank = {});

// mod.rule as the trainer and `gmod plan` read it: the rules above, p-MoD's "pmod" / "pmod:official_31" (the layers
// its ratio schedule routes, mod/pmod.h), or PyramidDrop's "pdrop:<layers>:<ratios>" (mod/pdrop.h). One place, so
// that a method's rule touches no caller.
// Whether `rule` selects layers by per-layer ARank (threshold, keep_top); a syntax error throws, naming the rule.
bool rule_needs_arank(const std::string& rule);
// The MoDConfig `rule` gives an LLM of `num_layers` layers from `base` (a run's mod.config): `base` itself when it
// lists its layers; p-MoD's config (pmod_rule_config); else `base` with the rule's layers (`arank` as
// select_mod_layers needs it) and its selection recorded.
MoDConfig config_for_rule(const std::string& rule, const MoDConfig& base, int num_layers,
                          const std::vector<double>& arank = {});
// The share of a sample's tokens each MoD layer of `c` processes in training, in mod_layers' order, when the share
// `routable` of them can be routed (the image tokens): 1 - skip_frac·routable; p-MoD 1 - (1 - ratio_l)·routable.
std::vector<double> planned_kept_fractions(const MoDConfig& c, int num_layers, double routable);

// Replaces cfg.mod_layers of model.llm->layers by MoDDecoderLayers sharing the dense submodules; for
// γ-MoD registers the shared router on the model as "mod_router"; for A-MoD makes each dense layer
// before a MoD layer leave attention scores. Validates cfg; throws if the model is already converted.
void convert_to_mod(MultimodalLM& model, const MoDConfig& cfg);

// The MoD layers of a converted model, in layer order (empty for a dense model).
std::vector<std::shared_ptr<MoDDecoderLayer>> mod_layers(const MultimodalLM& model);
// The model's shared γ-MoD router, or nullptr.
std::shared_ptr<GammaRouterImpl> shared_router(const MultimodalLM& model);
// Sets every MoD layer's routing mode (top-k / thresholds / auto from train()).
void set_routing_mode(MultimodalLM& model, RoutingMode mode);

// λ Σ_l ℓ_l over the routing losses the MoD layers pushed to st.aux_losses (undefined if none).
at::Tensor total_routing_loss(const ForwardState& st, const MoDConfig& cfg);

}  // namespace gmod

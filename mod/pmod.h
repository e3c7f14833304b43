// p-MoD (Zhang et al., ICCV 2025, "p-MoD: Building Mixture-of-Depths MLLMs via Progressive Ratio Decay"; code
// MCG-NJU/p-MoD) as a router kind of gmod's MoD layer (RouterKind::kPMoD, config router "pmod"):
//  - progressive ratio decay: MoD layer l keeps ratio_l = max(decay(l), pmod_min_ratio) of each sample's image
//    tokens, decay(l) = cos(l·π/N)/2 + pmod_factor ("shiftedcos") or (0.5 - l/N) + pmod_factor ("shiftedlinear");
//    the MoD layers are exactly those with decay(l) <= pmod_max_ratio (the others stay dense). N is the LLM's
//    num_layers - 1 (pmod_denominator "depth", default) or the official code's hard-coded 31 ("official_31", right
//    for 32-layer LLMs only; checkpoints of the original code load with it, as they were trained);
//  - per sample, the top trunc(n_img·ratio_l) image tokens by router weight are processed (computed as the code
//    does: float32 n_img times float32 ratio, truncated), with every non-image real token; only image tokens
//    are routed; the kept tokens attend among themselves at their original RoPE positions;
//  - TanhNorm + STRing: a per-layer router Linear(D, 1, bias) on the layer input gives r, w = s·tanh(r) + b
//    (pmod_tanh_scale 0.2, pmod_tanh_bias 1); a kept image token leaves the layer as h + w·MLP(norm(h)) with
//    h = x + attn(x), a skipped image token as w·x (the same weight on both sides); text tokens are unscaled;
//  - no routing loss: the LM loss only.
// The same top-k runs in training and at inference (the original has no threshold rule); at prefill a p-MoD
// layer's KV cache holds the kept tokens only and decode tokens (text) are always processed.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <nlohmann/json_fwd.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "mod/mod_config.h"
#include "mod/mod_layer.h"

namespace gmod {

// decay(l) of the schedule (before the pmod_min_ratio floor) on an LLM of `num_layers` layers.
double pmod_decay(const MoDConfig& c, int layer, int num_layers);
// ratio_l = max(decay(l), pmod_min_ratio).
double pmod_ratio(const MoDConfig& c, int layer, int num_layers);
// The layers the schedule routes: decay(l) <= pmod_max_ratio, ascending.
std::vector<int> pmod_layers(const MoDConfig& c, int num_layers);
// trunc(float(n_img) · float(ratio)): the image tokens a sample keeps (the original's float32 arithmetic).
int64_t pmod_kept_images(int64_t n_img, double ratio);

// Appends "\n  <problem>" lines for bad p-MoD fields (validate() asks PModSelector::check_section when router is pmod).
void validate_pmod(const MoDConfig& c, int num_layers, std::ostream& err);

// A MoDConfig for p-MoD with the official script's parameters (shiftedcos, factor 0.5, max 0.85, min 0.15,
// tanh 0.2 / 1, router bias, zero router init) and mod_layers filled from the schedule (validated).
MoDConfig pmod_config(int num_layers, PModDenominator denominator = PModDenominator::kDepth);

// The conversion rules that select p-MoD ("pmod": denominator num_layers-1; "pmod:official_31": the original code's
// 31), for `gmod convert --rule` and the trainer's mod.rule.
bool is_pmod_rule(const std::string& rule);
// The MoDConfig such a rule gives an LLM of `num_layers` layers: p-MoD's official defaults (pmod_config), or, when
// `base.router` is pmod (mod.config set by the user), base's p-MoD fields with the rule's denominator; mod_layers
// from the schedule, validated. Throws std::invalid_argument naming the rule for anything else.
MoDConfig pmod_rule_config(const std::string& rule, const MoDConfig& base, int num_layers);

// The MoDConfig an original p-MoD config.json (model_type pmod_llava_llama; its flat mod_* keys: mod_target_layers
// "<shiftedcos|shiftedlinear>_decay_<max>_<min>", mod_router_factor, mod_weight_norm "tanh_<scale>_<bias>",
// mod_bias_enabled, mod_target_token_type "vision_all") describes, with `denominator` (official_31: as the code
// trained it). Errors name `source` and the key.
MoDConfig pmod_config_from_official(const nlohmann::json& config, int num_layers, PModDenominator denominator,
                                    const std::string& source);

// p-MoD's router: Linear(D, 1) with an optional bias on the layer input; "weight" [1, D], "bias" [1].
class PModRouterImpl : public torch::nn::Module {
 public:
  PModRouterImpl(int64_t hidden, bool bias, const std::string& init, uint64_t seed, at::TensorOptions opts);
  at::Tensor logits(const at::Tensor& x) const;  // [B, L, D] -> r [B, L] (fp32, double for double)
  at::Tensor weight, bias;
};

// TanhNorm: s·tanh(r) + b in r's dtype (pmod_weight_norm "none": s·r + b, the original's "none").
at::Tensor pmod_weight(const MoDConfig& c, const at::Tensor& r);

// Capacity of a p-MoD layer: k_b = valid_b - n_img_b + kept_b (kept_b = pmod_kept_images(n_img_b, ratio)), on the host
// from count_routing_roles' [B, 4] counts (no device sync), and the same [B] int64 on the masks' device (routable =
// the image tokens), computed there with the same float32 product, so both agree exactly.
HostCapacity pmod_capacity(const at::Tensor& host_counts, double ratio);
at::Tensor pmod_capacity(const RoutingMasks& m, double ratio);

}  // namespace gmod

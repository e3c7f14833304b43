// Mixture-of-Depths configuration: which layers route, with which router, how many tokens they skip
// and how inference decides. Plain data with defaults; `mod_config_from_json` reads and validates it in
// one place, and `to_json` writes the object the checkpoint's config.json records under "mod".
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace gmod {

enum class RouterKind {
  kGammaShared,  // γ-MoD: one Linear(D->2, no bias) shared by every MoD layer; MLP delta x p
  kPerLayer,     // Raposo et al.: Linear(D->1, no bias) per MoD layer on the block input; block delta x r
  kAttention,    // A-MoD: parameter-free, column means of the previous layer's attention; no scaling
  kFastV,        // FastV (mod/fastv.h): parameter-free; layers >= fastv_k drop the image tokens the last prompt
                 // token attends to least at layer fastv_k - 1; inference baseline
  kPMoD,         // p-MoD (mod/pmod.h): Linear(D->1, bias) per MoD layer; keeps a decaying ratio of the image
                 // tokens per layer; TanhNorm weight on kept (MLP delta) and skipped (x) image tokens
  kPDrop,        // PyramidDrop (mod/pdrop.h): parameter-free; stages of layers keep shrinking shares of the image
                 // tokens, ranked at each stage boundary by the last instruction token's attention
};

// PyramidDrop in training: what a sample without an answer (nothing to take the instruction token from) does.
enum class PDropUnanswered {
  kLastToken,  // ranks by its last token, as at inference (default)
  kKeepAll,    // the original's training code: the sample keeps every token at every stage
};

// p-MoD's ratio schedule over depth (mod/pmod.h) and the denominator N of l/N in it.
enum class PModSchedule { kShiftedCos, kShiftedLinear };
enum class PModDenominator {
  kDepth,       // num_layers - 1: the paper's formula on any depth (default)
  kOfficial31,  // the official code's hard-coded 31 (= num_layers - 1 of a 32-layer LLM only)
};
enum class PModWeightNorm { kTanh, kNone };

// Which non-routable tokens are forced to be processed. Routable = image ∪ system prefix in both.
enum class ForcedKeep {
  kQuestions,         // paper (Table 1 default "Q"): answers are routable too
  kQuestionsAnswers,  // official code: everything after the image prefix is kept (default)
};

// Which tokens a γ-MoD layer may skip in training (top-k) and how many.
enum class CapacityRule {
  kRoles,           // per sample: routable = its image ∪ system tokens (by role), skip floor(skip_frac·routable_b)
                    // of them; every sample is routed, whatever its length (default)
  kOfficialPrefix,  // Gamma-MOD's training code: routable = the first official_prefix positions of the padded row,
                    // whatever their roles, skip floor(skip_frac·routable_b); a batch whose padded row length L is
                    // at most official_prefix keeps every token (the MLP delta still scaled by p)
};

enum class RopePositions {
  kCompacted,  // 0..k-1 over the processed tokens (official code and released weights; default)
  kOriginal,   // the tokens' positions in the full sequence
};

// What the routing rule is in a full-sequence forward. kAuto: top-k while the module is training,
// thresholds in eval mode (and always thresholds at decode).
enum class RoutingMode { kAuto, kTopK, kThreshold };

// A-MoD layers whose previous layer is also a MoD layer have no full attention map to route by; what they use as
// the score of a token that previous layer skipped. The paper interleaves MoD and dense layers, so by default
// consecutive A-MoD layers are a configuration error; the other two are adaptations.
enum class AmodSkippedScore {
  kInterleaved,  // every A-MoD layer must follow a dense layer (paper; default)
  kCarry,        // adaptation: the score from the last layer that processed it (stale by one or more layers)
  kForceKeep,    // adaptation: +inf, always processed next
};

// Which tokens an A-MoD layer may skip.
enum class AmodRoutable {
  kAll,    // every real token, capacity C = 1 - skip_frac of the sample (paper; default)
  kRoles,  // adaptation: only the γ-MoD routable roles (image ∪ system, plus answers with forced_keep questions)
};

// Inference thresholds adapted per sample or per layer (mod/routing_rule.h; γ-MoD rebuttal, reviewer wmRq):
// δ = δ_s·(1 + ln(seqlen / avg_seqlen)) or δ_s·(1 + ln(ARank_l / mean ARank)), δ_s = infer_threshold and
// decode_threshold. Threshold routing (γ-MoD, per-layer routers) only.
enum class AdaptiveThreshold { kNone, kSeqLen, kARank };

struct MoDConfig {
  std::vector<int> mod_layers;  // decoder layer indices that become MoD layers (sorted, unique)
  RouterKind router = RouterKind::kGammaShared;
  // Training capacity: each sample skips floor(skip_frac * routable_count) of its routable tokens.
  // The paper's "routing ratio"; the official code hard-codes 0.5.
  double skip_frac = 0.5;
  ForcedKeep forced_keep = ForcedKeep::kQuestionsAnswers;
  // Reproduction switch for the original's training routing (docs/mod.md "Short sequences"); γ-MoD router only.
  CapacityRule capacity_rule = CapacityRule::kRoles;
  int official_prefix = 1059;  // kOfficialPrefix: the original's hard-coded 1024 image + 35 instruction tokens
  RopePositions rope_positions = RopePositions::kCompacted;
  double router_aux_loss_coef = 0.01;  // λ: total loss = LM + λ Σ_l routing CE_l
  double infer_threshold = 0.005;      // prefill keeps a routable token iff p > this (γ-MoD)
  double decode_threshold = 0.5;       // decode keeps a token iff p >= this (γ-MoD; Raposo uses it for sigmoid(r))
  bool decode_skip = true;             // false: every decode token is processed (MGM eval behaviour)
  bool scale_by_router = true;         // false: no p / r scaling of the deltas (tests, ablations)
  std::string router_init = "kaiming_uniform";  // "kaiming_uniform" (LLaVA-HR code), "xavier_uniform" (MGM), "zero"
  uint64_t router_init_seed = 0;
  // A-MoD (router attention) as the paper defines it by default: scores normalised by 1/N, every token routable
  // at capacity C = 1 - skip_frac (k_b = ceil(C * valid_b)), MoD layers interleaved with dense ones. Adaptations
  // for a causal decoder (the previous behaviour): amod_causal_normalise (divide column i by the number of
  // queries that can see it), amod_routable "roles", amod_skipped "carry" / "force_keep" (consecutive layers).
  bool amod_causal_normalise = false;
  AmodRoutable amod_routable = AmodRoutable::kAll;
  AmodSkippedScore amod_skipped = AmodSkippedScore::kInterleaved;
  RoutingMode mode = RoutingMode::kAuto;
  std::string selection;  // how mod_layers was chosen (e.g. "arank_mod", "threshold:110"), recorded only
  // FastV (router "fastv"): layers [fastv_k, n) are the routed ones (mod_layers must say so), scored at layer
  // fastv_k - 1; each keeps round(n_img·(1 - fastv_r)) of a sample's n_img image tokens (FastV's rounding:
  // Python's round, half to even) and drops the rest. Original RoPE positions (rope_positions "original").
  int fastv_k = 2;
  double fastv_r = 0.5;
  AdaptiveThreshold adaptive_threshold = AdaptiveThreshold::kNone;
  double avg_seqlen = 0.0;          // kSeqLen: mean token count of the tuning data (> 0)
  std::vector<double> layer_arank;  // kARank: ARank of each MoD layer, in mod_layers order (> 0)
  // Where avg_seqlen came from (given, or which records it is the mean over); recorded only.
  std::string avg_seqlen_source;
  // p-MoD (router "pmod", mod/pmod.h): ratio_l = max(decay(l), pmod_min_ratio), decay(l) = cos(l·π/N)/2 +
  // pmod_factor; the MoD layers are those with decay(l) <= pmod_max_ratio (mod_layers_idx must list exactly
  // them); router weight w = pmod_tanh_scale·tanh(r) + pmod_tanh_bias. Defaults: the official LLaVA-1.5 script.
  PModSchedule pmod_schedule = PModSchedule::kShiftedCos;
  PModDenominator pmod_denominator = PModDenominator::kDepth;
  double pmod_factor = 0.5;
  double pmod_max_ratio = 0.85;
  double pmod_min_ratio = 0.15;
  PModWeightNorm pmod_weight_norm = PModWeightNorm::kTanh;
  double pmod_tanh_scale = 0.2;
  double pmod_tanh_bias = 1.0;
  bool pmod_router_bias = true;
  // PyramidDrop (router "pdrop", mod/pdrop.h): stage s starts at layer pdrop_layers[s] (strictly increasing, >= 1)
  // and keeps trunc(n_img·pdrop_ratios[s]) of a sample's n_img image tokens (non-increasing); mod_layers_idx is
  // every layer from pdrop_layers[0] on; rope_positions "compacted" (the original renumbers after each drop).
  std::vector<int> pdrop_layers;
  std::vector<double> pdrop_ratios;
  PDropUnanswered pdrop_unanswered = PDropUnanswered::kLastToken;

  bool is_mod_layer(int i) const;
};

// Throws std::invalid_argument naming `source` and every bad field.
void validate(const MoDConfig& c, int num_layers, const std::string& source = "MoDConfig");
nlohmann::json to_json(const MoDConfig& c);
MoDConfig mod_config_from_json(const nlohmann::json& j, const std::string& source = "mod config");

std::string to_string(RouterKind k);
// "gamma_shared", "per_layer", "attention", "fastv", "pmod", "pdrop" -> the kind; std::invalid_argument naming
// `source` and the known names otherwise.
RouterKind router_kind(const std::string& name, const std::string& source = "router");
std::string to_string(ForcedKeep k);
std::string to_string(CapacityRule k);
std::string to_string(RopePositions k);
std::string to_string(RoutingMode k);
std::string to_string(AmodSkippedScore k);
std::string to_string(AmodRoutable k);
std::string to_string(AdaptiveThreshold k);
std::string to_string(PModSchedule k);
std::string to_string(PModDenominator k);
std::string to_string(PModWeightNorm k);
std::string to_string(PDropUnanswered k);

}  // namespace gmod

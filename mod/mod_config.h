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
};

// Which non-routable tokens are forced to be processed. Routable = image ∪ system prefix in both.
enum class ForcedKeep {
  kQuestions,         // paper (Table 1 default "Q"): answers are routable too
  kQuestionsAnswers,  // official code: everything after the image prefix is kept (default)
};

enum class RopePositions {
  kCompacted,  // 0..k-1 over the processed tokens (official code and released weights; default)
  kOriginal,   // the tokens' positions in the full sequence
};

// What the routing rule is in a full-sequence forward. kAuto: top-k while the module is training,
// thresholds in eval mode (and always thresholds at decode).
enum class RoutingMode { kAuto, kTopK, kThreshold };

// What an A-MoD layer uses as the score of a token the previous (MoD) layer skipped.
enum class AmodSkippedScore {
  kCarry,      // the score from the last layer that processed it (default)
  kForceKeep,  // +inf: always processed next
};

struct MoDConfig {
  std::vector<int> mod_layers;  // decoder layer indices that become MoD layers (sorted, unique)
  RouterKind router = RouterKind::kGammaShared;
  // Training capacity: each sample skips floor(skip_frac * routable_count) of its routable tokens.
  // The paper's "routing ratio"; the official code hard-codes 0.5.
  double skip_frac = 0.5;
  ForcedKeep forced_keep = ForcedKeep::kQuestionsAnswers;
  RopePositions rope_positions = RopePositions::kCompacted;
  double router_aux_loss_coef = 0.01;  // λ: total loss = LM + λ Σ_l routing CE_l
  double infer_threshold = 0.005;      // prefill keeps a routable token iff p > this (γ-MoD)
  double decode_threshold = 0.5;       // decode keeps a token iff p >= this (γ-MoD; Raposo uses it for sigmoid(r))
  bool decode_skip = true;             // false: every decode token is processed (MGM eval behaviour)
  bool scale_by_router = true;         // false: no p / r scaling of the deltas (tests, ablations)
  std::string router_init = "kaiming_uniform";  // "kaiming_uniform" (LLaVA-HR code), "xavier_uniform" (MGM), "zero"
  uint64_t router_init_seed = 0;
  // A-MoD: divide column i by the number of queries that can see it (causal) instead of by N.
  bool amod_causal_normalise = true;
  AmodSkippedScore amod_skipped = AmodSkippedScore::kCarry;
  RoutingMode mode = RoutingMode::kAuto;
  std::string selection;  // how mod_layers was chosen (e.g. "arank_mod", "threshold:110"), recorded only

  bool is_mod_layer(int i) const;
};

// Throws std::invalid_argument naming `source` and every bad field.
void validate(const MoDConfig& c, int num_layers, const std::string& source = "MoDConfig");
nlohmann::json to_json(const MoDConfig& c);
MoDConfig mod_config_from_json(const nlohmann::json& j, const std::string& source = "mod config");

std::string to_string(RouterKind k);
std::string to_string(ForcedKeep k);
std::string to_string(RopePositions k);
std::string to_string(RoutingMode k);
std::string to_string(AmodSkippedScore k);

}  // namespace gmod

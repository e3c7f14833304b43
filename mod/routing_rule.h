// Adaptive inference thresholds for threshold-routed MoD layers (γ-MoD rebuttal to reviewer wmRq): the static
// threshold δ_s (MoDConfig::infer_threshold at prefill, decode_threshold at decode) becomes
//   seqlen: δ = δ_s·(1 + ln(seqlen_b / avg_seqlen))   per sample, seqlen_b = its valid tokens in the forward
//           (the prompt at prefill; prompt + generated so far, the new token included, at decode, which is
//           what a full recompute of that step sees);
//   arank:  δ = δ_s·(1 + ln(ARank_l / mean_l ARank_l)) per MoD layer l (layer_arank, from the conversion).
// Implemented as the rebuttal writes them (natural log). A token is kept when its probability exceeds δ, so a
// larger δ skips more: longer samples and higher-ARank layers skip more. δ may leave [0, 1] (then every or no
// routable token is kept).
#pragma once

#include <ATen/ATen.h>

#include "mod/mod_config.h"

namespace gmod {

// The factor δ / δ_s of MoD layer `layer_idx` for samples with `seqlen` [B] valid tokens: [B] double on
// seqlen's device (all 1 for AdaptiveThreshold::kNone).
at::Tensor threshold_factor(const MoDConfig& c, int layer_idx, const at::Tensor& seqlen);
// δ_s · threshold_factor: [B] double.
at::Tensor routing_thresholds(const MoDConfig& c, int layer_idx, double base, const at::Tensor& seqlen);
// The decode step's thresholds from decode_threshold: seqlen = key_valid [B, T] summed (the history with the
// new token), or `length` for every sample when key_valid is undefined. [B] double.
at::Tensor adaptive_decode_thresholds(const MoDConfig& c, int layer_idx, const at::Tensor& key_valid,
                                      int64_t B, int64_t length);

}  // namespace gmod

// The Mixture-of-Depths decoder layer. Each sample's tokens are split by role into routable
// (image ∪ system prefix), forced-keep (questions, or questions + answers) and padding (never
// processed). The layer picks the tokens to process (top-k in training, thresholds at inference),
// gathers them into a compacted [B, kmax, D] sequence, runs attention + MLP on it (so cost scales with
// the kept tokens), and scatters the results back; skipped tokens leave the layer bit-identical.
//
// Ragged kept counts without a mask: each sample's kept tokens come first in its compacted row (ascending),
// the slots up to kmax after them. Under plain causal attention (the fused kernel, no boolean mask) a real
// query then only sees real keys; the padded slots' rows are computed and discarded by the scatter (no
// gradient reaches them). The result equals the masked path within float rounding.
//
// No host synchronisation in training: the top-k capacities (γ-MoD, per-layer, A-MoD, and their replay under
// activation checkpointing) follow from the token roles alone, so they are taken from ForwardState::
// host_role_counts (counted once per forward on the host) and the accounting is filled from them. Only the
// data-dependent inference paths (thresholds, decode, forced_selection) read counts back from the device.
//
// It reuses the dense layer's submodules, so parameter names stay llm.layers.{i}.self_attn.q_proj.weight etc.
//
// Capacity (training): k_b = valid_b - floor(skip_frac * routable_b) per sample, from that sample's
// roles. The official code uses k = ceil(L - 0.5 R) with the padded batch length L and a constant R = 1059,
// which treats a sample's first R positions as routable whatever they hold, and keeps every token of a batch
// with L <= R; capacity_rule "official_prefix" reproduces that (apply_official_prefix).
//
// Routing loss: 2-class CE between the router logits and top-k membership, averaged over valid (non-pad)
// positions; the official code averages over all B*L (padding included, with target 1). Pushed unweighted
// to ForwardState::aux_losses (use total_routing_loss() for λ Σ_l ℓ_l).
#pragma once

#include "mod/router.h"

namespace gmod {

class PModRouterImpl;  // mod/pmod.h
class TokenSelector;   // mod/token_selection.h: the layer's method

struct RoutingMasks {
  at::Tensor valid;     // [B, L] bool: real tokens (not padding)
  at::Tensor routable;  // [B, L] bool: may be skipped
  at::Tensor forced;    // [B, L] bool: valid and not routable, always processed
};
// roles [B, L] int8 TokenRole (undefined: nothing routable); key_valid [B, L] bool (undefined: no padding).
// `all_routable` (A-MoD as the paper defines it): every valid token is routable, whatever its role.
RoutingMasks routing_masks(const at::Tensor& roles, const at::Tensor& key_valid, int64_t B, int64_t L,
                           ForcedKeep forced_keep, at::Device device, bool all_routable = false);

// Per-sample training capacity k_b = valid_b - floor(skip_frac * routable_b); [B] int64 (on the masks' device).
at::Tensor topk_capacity(const RoutingMasks& m, double skip_frac);

// The same capacities on the host, from count_routing_roles (model/decoder_layer.h) [B, 4]: no device sync.
struct HostCapacity {
  std::vector<int64_t> k, valid, routable;  // per sample
  int64_t kmax = 0;
  LayerTokens tokens(int layer) const;      // processed Σk, total Σvalid, attn_pairs Σk(k+1)/2, routable
};
HostCapacity host_capacity(const at::Tensor& counts, double skip_frac, ForcedKeep forced_keep, bool all_routable);

// Gamma-MOD's training capacity (MoDConfig::capacity_rule "official_prefix"): the routable tokens are the valid ones
// among the first `prefix` positions of the padded row, whatever their roles, and none when the padded row length
// L <= prefix (the batch keeps every token); the rest are forced.
void apply_official_prefix(RoutingMasks& m, int64_t L, int64_t prefix);
// Host capacities from the masks themselves (one device-to-host copy), for masks the role counts do not describe.
HostCapacity host_capacity(const RoutingMasks& m, double skip_frac);

// Tokens processed in training: every forced token plus the highest-scoring routable tokens up to k_b.
// score [B, L] (any real dtype), k [B] int64, kmax = max k_b (< 0: read from k, a host sync). Returns [B, L] bool.
at::Tensor select_topk(const at::Tensor& score, const RoutingMasks& m, const at::Tensor& k, int64_t kmax = -1);
// What select_topk ranks by: [B, L] double, +inf on forced tokens, the score on routable ones, -inf elsewhere.
at::Tensor topk_key(const at::Tensor& score, const RoutingMasks& m);

// Sorted per-sample positions of the selected tokens, padded to the batch maximum with (distinct)
// unselected positions so that a scatter of unchanged rows is a no-op.
struct Compaction {
  at::Tensor index;   // [B, K] int64: selected positions ascending, then the rest
  at::Tensor valid;   // [B, K] bool: slot holds a selected token
  at::Tensor counts;  // [B] int64: selected tokens per sample
  int64_t kmax = 0;   // K
};
// selected [B, L] bool; `counts` [B] (= selected.sum(1)) and `kmax` (= max counts) when the caller knows them,
// else they are computed (kmax < 0: a host sync).
Compaction compact(const at::Tensor& selected, const at::Tensor& counts = at::Tensor(), int64_t kmax = -1);
at::Tensor gather_tokens(const at::Tensor& h, const at::Tensor& index);  // [B, L, D] -> [B, K, D]
// h with the valid rows of y [B, K, D] written back to their positions (other rows untouched).
at::Tensor scatter_tokens(const at::Tensor& h, const Compaction& c, const at::Tensor& y);

// Mean over valid positions of CE(logits [B, L, 2], selected [B, L] bool).
at::Tensor routing_loss(const at::Tensor& logits, const at::Tensor& selected, const at::Tensor& valid);

class MoDDecoderLayer : public DecoderBlock {
 public:
  // `shared_router` is required for RouterKind::kGammaShared (it is registered once on the model, not
  // here); a per-layer router is created and registered as "router" for RouterKind::kPerLayer.
  // `emit_scores`: leave A-MoD scores in ForwardState::routing_scores for the next layer.
  MoDDecoderLayer(const DenseDecoderLayer& dense, const MoDConfig& cfg, std::shared_ptr<GammaRouterImpl> shared_router,
                  int layer_idx, bool emit_scores);

  // Full sequence (training, prefill; with ForwardState::caches the layer's cache then holds only the
  // processed tokens, per-sample lengths in KVCache::lengths) or one decode step [B, 1, D].
  at::Tensor forward(const at::Tensor& h, ForwardState& st, int layer_idx) override;
  bool is_mod() const override { return true; }
  std::vector<at::Tensor> external_parameters() const override;  // the shared γ-MoD router
  bool uses_topk() const;

  // keep probability (γ: p, Raposo: sigmoid(r), p-MoD: w), block weight and routing logits for h [B, L, D].
  struct Scores {
    at::Tensor keep_prob, weight, logits, normed;
  };
  Scores score(const at::Tensor& h) const;  // the method's (mod/token_selection.h)
  at::Tensor combine(const at::Tensor& x, const at::Tensor& a, const at::Tensor& m, const at::Tensor& w) const;
  // For a method's attach(): registers its per-layer router as "router" (llm.layers.{i}.router.*).
  template <class M>
  std::shared_ptr<M> register_router(std::shared_ptr<M> m) {
    return register_module("router", std::move(m));
  }

  std::shared_ptr<RMSNormImpl> input_layernorm, post_attention_layernorm;
  std::shared_ptr<AttentionImpl> self_attn;
  std::shared_ptr<MLPImpl> mlp;
  std::shared_ptr<GammaRouterImpl> shared_router;  // γ-MoD (owned by the model as "mod_router")
  std::shared_ptr<ScalarRouterImpl> router;        // per-layer (Raposo), "llm.layers.{i}.router.weight"
  std::shared_ptr<PModRouterImpl> pmod_router;     // p-MoD, "llm.layers.{i}.router.{weight,bias}"
  double pmod_ratio = 1.0;                         // p-MoD: this layer's image-token ratio (convert_to_mod sets it)
  MoDConfig cfg;
  bool emit_scores = false;
  const TokenSelector* method = nullptr;  // registered for cfg.router (mod/method_registry.h)

  // Replay and analysis. When defined, the next full-sequence forward processes exactly these tokens
  // ([B, L] bool, intersected with the valid ones) instead of routing; it is not cleared. (A replayed selection,
  // RoutingPass::kReplay, is the first pass's: for capacity-driven routing its per-sample counts are taken from
  // the host capacities, not re-read from the device.)
  at::Tensor forced_selection;
  bool record_selection = false;
  std::vector<at::Tensor> recorded;  // one [B, L] bool per forward (decode steps: [B, 1])
  // Beside each recorded top-k selection (training, A-MoD): the topk_key it was chosen by, so a test can see how
  // close the last kept and the first skipped token were (a near-tie may flip under other arithmetic).
  std::vector<at::Tensor> recorded_keys;

 private:
  at::Tensor decode_step(const at::Tensor& h, ForwardState& st, int layer_idx, KVCache& cache);
  // Named error unless this layer's method can route packed rows per segment.
  void check_packed_routing(int layer_idx) const;
};

}  // namespace gmod

// Compute accounting for dense and MoD forwards from ForwardState::tokens: skip ratio per layer and overall,
// and the FLOPs executed against the dense model on the same tokens, with one formula for both.
//
// FLOPs count matrix multiplies (2 per multiply-add) of useful work: valid (non-pad) tokens only, as MFU
// counts model FLOPs (padding rows a kernel also computes are waste, not work). Per forward:
//  - decoder layer: per processed token the Q/K/V/O and SwiGLU projections (token_linear_flops), plus
//    attention_pair_flops per causal query-key pair (QK^T and PV). MoD layers report their pairs (Σ_b
//    k_b(k_b+1)/2 at prefill/training, Σ over processing samples of their compacted cache length + 1 at
//    decode); dense layers and the dense reference use each sample's new tokens n_b after its c_b cached
//    ones: n_b·c_b + n_b(n_b+1)/2.
//  - ragged MoD batches: a full-sequence MoD layer compacts its kept tokens to [B, k_max] (mod/mod_layer.h)
//  and its
//    projections and fused causal kernel run on all B·k_max rows (B·k_max(k_max+1)/2 pairs), padding
//    included. With ForwardShape::mod_kmax (the capacity plan: training, top-k, A-MoD) the MoD layers are
//    credited exactly that, what executes; `processed` stays Σ_b k_b (the routing decision, for skip ratios).
//    Without it (threshold routing, whose k_max the host does not know) the kept tokens are counted.
//  - LM head: 2·D·V per position it ran on; vision tower (CLIP layers up to the feature layer, patch
//  embedding,
//    non-causal attention) and projector per image. These are the same with and without MoD.
//  - Not counted: embedding lookups (no multiplies), norms, softmax, the γ-MoD router (2·2·D per token, <
//  0.1%
//    of a layer), A-MoD's score passes.
// The dense reference of a decode step is the same step without MoD (every valid sample's token through every
// layer, attending to its whole history), so generation reports are exact too. Training FLOPs (forward +
// backward, frozen parts) are built on these in trainer/flops.h.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/decoder_layer.h"

namespace gmod {

struct LayerCompute {
  int layer = 0;
  bool mod = false;
  int64_t processed = 0, total = 0;
  int64_t computed = 0;  // rows the projections ran on: processed, or B·k_max for a padded MoD compaction
  double attn_pairs = 0, dense_attn_pairs = 0;
  double linear_flops = 0, attn_flops = 0;              // executed: projections, attention pairs
  double dense_linear_flops = 0, dense_attn_flops = 0;  // the dense layer on the same tokens
  double flops = 0, dense_flops = 0;                    // linear + attention
  double skip_ratio() const { return total ? 1.0 - static_cast<double>(processed) / total : 0.0; }
};

struct ComputeReport {
  std::vector<LayerCompute> layers;          // by layer index
  int64_t processed = 0, total = 0;          // all layers
  int64_t mod_processed = 0, mod_total = 0;  // MoD layers only
  int64_t images = 0, head_tokens = 0;
  double decoder_flops = 0, decoder_dense_flops = 0;
  double head_flops = 0, vision_flops = 0, projector_flops = 0;  // equal in the dense reference
  double flops = 0, dense_flops = 0;  // the whole forward: decoder + LM head + vision tower + projector
  double skip_ratio() const { return total ? 1.0 - static_cast<double>(processed) / total : 0.0; }
  double mod_skip_ratio() const { return mod_total ? 1.0 - static_cast<double>(mod_processed) / mod_total : 0.0; }
  double flop_ratio() const { return dense_flops > 0 ? flops / dense_flops : 1.0; }  // executed / dense
  double decoder_flop_ratio() const { return decoder_dense_flops > 0 ? decoder_flops / decoder_dense_flops : 1.0; }
  // Adds another forward's report (layer by layer).
  void add(const ComputeReport& other);
  std::string table() const;
  nlohmann::json to_json() const;
};

// What one forward ran on, for the dense reference and the parts outside the decoder.
struct ForwardShape {
  std::vector<int64_t> context;  // per sample: tokens already in the KV cache (0 without a cache)
  std::vector<int64_t> fresh;    // per sample: valid tokens this forward adds
  int64_t images = 0;            // images through the vision tower and projector
  int64_t head_tokens = -1;      // positions the LM head ran on; -1: every fresh token
  // Full-sequence forwards with a MoD capacity plan: its k_max (every MoD layer ran B x mod_kmax rows,
  // above); -1: not known (the layers' kept tokens are counted).
  int64_t mod_kmax = -1;
  // A full-sequence forward (training, eval, prefill) of samples with these valid lengths.
  static ForwardShape full(std::vector<int64_t> lengths, int64_t images = 0);
};

// Valid tokens per sample of a [B, L] mask (undefined: B samples of L tokens; pass B and L then).
std::vector<int64_t> sample_lengths(const at::Tensor& attention_mask, int64_t B = 0, int64_t L = 0);

// Forward FLOPs of one token through one layer's projections (attention in/out + SwiGLU MLP).
double token_linear_flops(const LlamaConfig& c);
// Forward FLOPs per causal query-key pair (QK^T and PV over all heads).
double attention_pair_flops(const LlamaConfig& c);
// Forward FLOPs of one image through the vision tower up to the feature layer, and through the projector.
double vision_tower_flops(const LlavaConfig& c);
double projector_flops(const LlavaConfig& c);

// One forward of the model: decoder from `tokens`, head and vision from `shape`.
ComputeReport account_forward(const std::vector<LayerTokens>& tokens, const LlavaConfig& c, const ForwardShape& shape);

// Decoder layers only, for full-sequence forwards of samples with `sample_lengths` valid tokens (empty: one
// sample of all tokens).
ComputeReport account_compute(const std::vector<LayerTokens>& tokens, const LlamaConfig& c,
                              const std::vector<int64_t>& sample_lengths);

}  // namespace gmod

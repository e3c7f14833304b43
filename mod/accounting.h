// Compute accounting for dense and MoD forwards from ForwardState::tokens: skip ratio per layer and
// overall, and executed FLOPs against the dense model on the same tokens. FLOPs count forward
// matrix multiplies (2 per multiply-add): per processed token the Q/K/V/O and MLP projections, plus
// 4·H·Dh per causal query-key pair (QK^T and PV). MoD layers report their pairs (Σ_b k_b(k_b+1)/2);
// dense layers and the dense reference use Σ_b n_b(n_b+1)/2 over the samples' valid lengths n_b.
// Exact for one full-sequence forward; for generation (prefill + decode entries) the skip ratios are
// exact (fraction of token×layer evaluations skipped, as the γ-MoD eval counts it) and the FLOPs
// are only indicative.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/decoder_layer.h"

namespace gmod {

struct LayerCompute {
  int layer = 0;
  bool mod = false;
  int64_t processed = 0, total = 0;
  double flops = 0, dense_flops = 0;
  double skip_ratio() const { return total ? 1.0 - static_cast<double>(processed) / total : 0.0; }
};

struct ComputeReport {
  std::vector<LayerCompute> layers;  // by layer index
  int64_t processed = 0, total = 0;          // all layers
  int64_t mod_processed = 0, mod_total = 0;  // MoD layers only
  double flops = 0, dense_flops = 0;
  double skip_ratio() const { return total ? 1.0 - static_cast<double>(processed) / total : 0.0; }
  double mod_skip_ratio() const { return mod_total ? 1.0 - static_cast<double>(mod_processed) / mod_total : 0.0; }
  double flop_ratio() const { return dense_flops > 0 ? flops / dense_flops : 1.0; }  // executed / dense
  std::string table() const;
  nlohmann::json to_json() const;
};

// Forward FLOPs of one token through one layer's projections (attention in/out + SwiGLU MLP).
double token_linear_flops(const LlamaConfig& c);
// Forward FLOPs per causal query-key pair (QK^T and PV over all heads).
double attention_pair_flops(const LlamaConfig& c);

// `sample_lengths`: valid tokens per sample of the forward(s) (empty: one sample of all tokens).
ComputeReport account_compute(const std::vector<LayerTokens>& tokens, const LlamaConfig& c,
                              const std::vector<int64_t>& sample_lengths);

}  // namespace gmod

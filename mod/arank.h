// ARank (γ-MoD §3): the mean rank of a layer's attention maps, which says how redundant its tokens
// are; low-rank layers become MoD layers. Follows the official compute_attention_rank: post-softmax
// probabilities, diagonal zeroed (a causal map with a positive diagonal is always full rank), float32,
// torch.linalg.matrix_rank with the default tolerance (σ > σ_max · n · eps_fp32), mean over heads.
// Per sample only its valid (unpadded) n x n block is used; mean and std across samples per layer.
// The model runs layer by layer and each layer's maps are reduced as soon as they exist, so only one
// layer's [B, H, L, L] probabilities live at a time.
#pragma once

#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/llava.h"

namespace gmod {

struct LayerARank {
  int layer = 0;
  double mean = 0, std = 0;  // std: sample standard deviation (n - 1), 0 for one sample
  int64_t samples = 0;
};

struct ARankResult {
  std::vector<LayerARank> layers;
  int64_t samples = 0;
  std::vector<double> means() const;  // one per layer, for select_mod_layers
  nlohmann::json to_json() const;
  std::string table() const;          // per-layer table with a bar chart
};

// One sample's map probs [H, n, n] (post-softmax) -> mean over heads of rank(map with zero diagonal).
double attention_rank(const at::Tensor& probs);

class ARankAccumulator {
 public:
  explicit ARankAccumulator(int num_layers);
  void add(int layer, double value);
  ARankResult result() const;

 private:
  std::vector<double> sum_, sumsq_;
  std::vector<int64_t> count_;
};

struct ARankOptions {
  int64_t max_samples = 0;  // 0: every sample of every batch (the paper finds ~50 enough)
  // Called with each layer's attention maps [B, H, L, L] (fp32) as ARank reads them, before they are reduced
  // (inspection; the tests compare them with the model's forward).
  std::function<void(int layer, const at::Tensor& maps)> on_maps;
};

// Runs each batch (no gradients) through a dense model with explicit attention and accumulates ARank
// per layer. Throws if the model has MoD layers (their maps cover only the processed tokens).
ARankResult compute_arank(MultimodalLM& model, const std::vector<ModelInputs>& batches, const ARankOptions& opt = {});

void write_arank_json(const ARankResult& r, const std::string& path);

}  // namespace gmod

// Training FLOPs of a step, for MFU: forward + backward of each part from what the forward really processed
// (mod/accounting.h: per-layer processed tokens and attention pairs, LM head, vision tower, projector), dense and
// MoD on the same formula, so a MoD step is credited only the work it did and the dense reference of the same
// tokens is reported next to it.
//
// Backward: a part whose weights train costs 2x its forward (activation gradients + weight gradients); a frozen
// part that gradients still flow through (something before it trains, e.g. frozen LLM layers under a trainable
// projector in stage 1) costs 1x its projections (activation gradients only) and 2x its attention pairs (the
// QK^T/PV backward is four multiplies whatever trains); a frozen part with nothing trainable before it (the frozen
// vision tower of LLaVA-1.5 SFT) costs its forward only. Activation-checkpointing recomputation is not counted
// (that would be hardware FLOPs, not model FLOPs). Counting conventions (valid tokens only, what is left out) are
// those of mod/accounting.h.
#pragma once

#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "mod/accounting.h"

namespace gmod {

// Which parts of the model have trainable weights.
struct TrainableParts {
  bool vision = false, projector = false, embedding = false, head = false;
  std::vector<bool> layers;  // per decoder layer: any trainable weight in it
  // From parameter names (vision.*, projector.*, llm.embed_tokens.weight, lm_head.weight, llm.layers.{i}.*) and
  // requires_grad; a tied head trains with the embedding.
  static TrainableParts of(const torch::nn::Module& model, int num_layers, bool tied_head);
};

struct TrainFlops {
  double flops = 0, dense_flops = 0;  // executed; the dense model on the same tokens
  TrainFlops& operator+=(const TrainFlops& o) {
    flops += o.flops, dense_flops += o.dense_flops;
    return *this;
  }
};

// Forward + backward FLOPs of one training forward whose report is `fwd`.
TrainFlops train_flops(const ComputeReport& fwd, const TrainableParts& parts);

}  // namespace gmod

// StepStats: what one optimizer step reports (the global figures of StepMetrics, trainer/metrics.h), counted by
// every rank over its micro-batches, then summed over the ranks by ONE all-reduce of one packed double vector
// (reduce_step_stats) together with the stop flag. That all-reduce runs after the window's gradient reductions
// (DpStrategy::all_reduce_after_gradients), so the step issues exactly one collective for its statistics.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <vector>

#include "trainer/flops.h"

namespace gmod {

// This rank's counts of one step.
struct StepStats {
  // n_mod: the MoD layers reported on (their per-layer vectors have that size); loss_options: the device and
  // dtype (double) of the loss sums, which accumulate on the device without a host sync.
  StepStats(size_t n_mod, const at::TensorOptions& loss_options);

  at::Tensor lm_loss_sum;       // Σ over micro-batches of the summed token losses (scalar, double, on the device)
  at::Tensor routing_loss_sum;  // Σ over micro-batches of Σ_l routing loss (same)
  int64_t tokens = 0, samples = 0;
  int64_t padded_tokens = 0;  // positions computed, padding included
  bool stop = false;          // a stop signal reached this rank
  TrainFlops flops;           // as executed, and the dense model's on the same tokens
  // Per MoD layer (in the order of the trainer's MoD layers): tokens it processed, tokens that entered it,
  // tokens its router could choose from.
  std::vector<int64_t> processed, entered, routable;
};

// The sums over all ranks.
struct StepTotals {
  double lm_loss_sum = 0, routing_loss_sum = 0;
  double tokens = 0, samples = 0, padded_tokens = 0;
  bool stop = false;  // on any rank
  TrainFlops flops;
  std::vector<double> processed, entered, routable;  // per MoD layer

  // Per MoD layer (mod_layers[i] the layer number of entry i) with tokens: the share of the tokens that entered it
  // that it skipped, and the share of its routable tokens.
  void skip_ratios(const std::vector<int>& mod_layers, std::map<int, double>& of_entered,
                   std::map<int, double>& of_routable) const;
};

// Packs `mine` into one double vector on `device`, sums it over the ranks with `all_reduce` (in place; one call)
// and unpacks it. Vector: [lm, routing, tokens, samples, stop, processed..., entered..., padded, flops,
// dense_flops, routable...].
StepTotals reduce_step_stats(const StepStats& mine, at::Device device,
                             const std::function<void(at::Tensor&)>& all_reduce);

}  // namespace gmod

// DpStrategy: the data-parallel strategy a trainer runs its steps through, whatever `optimizer.zero_stage` and
// `optimizer.offload` are. One object, built once by make_dp_strategy from the parallel settings:
//   ZeRO-0/1/2 (with or without offload): DataParallelOptimizer (parallel/data_parallel.h) behind this interface;
//   ZeRO-3 (with or without offload): Zero3Driver (parallel/zero3_driver.h), which also gathers the model's units
//   around their forward and backward through model/unit_hooks.h.
// The caller's side of one step, on every rank in the same order (ZeRO-3's calls are collectives):
//   per micro-batch: begin_forward, forward, end_forward, [last: set_last_micro_batch], backward, end_backward
//                    (a micro-batch this rank has no data for: idle_micro_batch(last) instead);
//   then all_reduce_after_gradients (the step's statistics), then step (clip, AdamW, gradients zeroed).
// Outside the step, with_full_params holds every parameter in full (evaluation, saving, loading weights); the
// optimizer state (state_dict / load_state_dict, the format of stage state_stage()) is what checkpoints hold.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/comm.h"
#include "parallel/data_parallel.h"
#include "parallel/flat_params.h"
#include "parallel/sharded_adamw.h"

namespace gmod {

// The parallel settings a strategy is built from (the trainer's optimizer section, resolved).
struct DpSettings {
  int zero_stage = 0;  // 0, 1, 2 or 3
  // AdamW hyper-parameters, clipping, buckets, reduce dtype, overlap, accumulate_fp32, offload, decay flags and
  // parameter groups; its `stage` is set from zero_stage (ZeRO-3 runs stage 2's arithmetic and state format).
  DataParallelOptions options;
  int zero3_prefetch = 1;                   // ZeRO-3 only
  bool zero3_reshard_after_forward = true;  // ZeRO-3 only
};

class DpStrategy {
 public:
  using NamedParams = std::vector<std::pair<std::string, at::Tensor>>;
  virtual ~DpStrategy() = default;

  // Around every micro-batch (see the top of this file).
  virtual void begin_forward() {}
  virtual void end_forward() {}
  // Before the backward of the window's last micro-batch: its backward may start the gradient reductions.
  virtual void set_last_micro_batch(bool last = true) = 0;
  virtual void end_backward() {}
  // A micro-batch this rank has no data for (all its records were bad): the collectives it would have run.
  virtual void idle_micro_batch(bool /*last*/) {}
  // all_reduce of `t` on the trainer's communicator once this window's gradient reductions are complete.
  virtual void all_reduce_after_gradients(at::Tensor& t, ReduceOp op = ReduceOp::Sum) = 0;
  // Reduce what is left, global-norm clip, AdamW with one learning rate per parameter group; gradients zeroed.
  virtual StepResult step(const std::vector<double>& lrs) = 0;

  // fn() with every parameter of the model held in full (ZeRO-3: gathered around it; collective).
  void with_full_params(const std::function<void()>& fn);
  // True when what with_full_params holds is freed after it (a save must copy the values it keeps).
  virtual bool full_params_transient() const { return false; }

  // The optimizer state of this rank (tensors alias the live state) and its checkpoint format.
  virtual const FlatParamLayout& layout() const = 0;
  virtual AdamWShardState state_dict() const = 0;
  // Loads a state covering exactly this rank's range (reshard_state for others). Collective.
  virtual void load_state_dict(const AdamWShardState& s) = 0;
  virtual int state_stage() const = 0;  // the ZeRO stage of state_dict()'s format (ZeRO-3: 2)
  // [begin, end) of the flat vector whose optimizer state lives on this rank.
  std::pair<int64_t, int64_t> state_range(int rank) const;

  // Accounting. The lines the trainer prints about the strategy ("optimizer: ZeRO-k, ...").
  virtual std::string describe() const = 0;
  virtual int64_t host_state_bytes() const = 0;  // optimizer.offload: the state in host memory
  // Traffic of the strategy's own communicator for gradient reductions, when it has one besides the trainer's.
  virtual CommStats side_comm_stats() const { return {}; }

 protected:
  virtual void gather_all() {}
  virtual void release_all() {}
};

// The ranks of a saved optimizer state (`saved` layout, ZeRO stage saved_stage over saved_world ranks) whose files
// hold part of the flat range [range.first, range.second) (state_range of the new run): stage 0 kept it all on
// rank 0, the others their shards.
std::vector<int> saved_state_ranks(const FlatParamLayout& saved, int saved_stage, int saved_world,
                                   std::pair<int64_t, int64_t> range);

// Builds the strategy for `settings` over `trainable` (the model's trainable parameters in named_parameters order;
// rank 0's values are broadcast to every rank). `units`: the model's hooked units in forward order
// (model/unit_hooks.h hooked_units), used by ZeRO-3 only. Collective.
std::unique_ptr<DpStrategy> make_dp_strategy(const DpSettings& settings, DpStrategy::NamedParams trainable,
                                             std::shared_ptr<Comm> comm,
                                             std::vector<std::shared_ptr<torch::nn::Module>> units);

}  // namespace gmod

// DataParallelOptimizer: data-parallel training step over a Comm with ZeRO stage 0/1/2 AdamW.
//   stage 0: gradients all-reduced (averaged) in buckets; every rank runs AdamW on the whole vector.
//   stage 1: gradients all-reduced; each rank keeps fp32 master + moments for its shard only, updates it, and the
//            updated shards are all-gathered into every rank's compute parameters.
//   stage 2: gradients reduce-scattered, so each rank only receives its shard's averaged gradient.
// The trainable parameters become views into one flat compute buffer [padded P] and their .grad views into one flat
// gradient buffer, so backward accumulates in place (gradient accumulation = several backward() calls, then step();
// nothing is communicated per micro-batch) and the all-gather writes parameters in place. Gradient clipping uses
// the global norm (equal to the unsharded one); a non-finite gradient on any rank makes every rank skip the step.
// No model knowledge: it only sees (name, tensor) pairs; frozen parameters are simply not passed.
#pragma once

#include "parallel/comm.h"
#include "parallel/flat_params.h"
#include "parallel/sharded_adamw.h"

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace gmod {

struct DataParallelOptions {
  int stage = 0;  // 0, 1 or 2
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  double max_grad_norm = 0.0;                // <= 0: no clipping (the norm is still computed)
  int64_t bucket_bytes = int64_t(25) << 20;  // per collective, in reduce_dtype bytes
  at::ScalarType reduce_dtype = at::kFloat;  // gradient communication dtype (fp32 or the params' dtype)
};

struct StepResult {
  double grad_norm = 0.0;  // global L2 norm of the averaged gradient, before clipping
  bool skipped = false;    // non-finite gradient on some rank: no rank updated
  bool clipped = false;
};

class DataParallelOptimizer {
 public:
  using NamedParams = std::vector<std::pair<std::string, at::Tensor>>;

  // params: trainable leaf tensors, all with one floating dtype on comm->device(), in a deterministic order (every
  // rank passes the same names and shapes). Their storage moves into the flat buffer (values and any existing
  // .grad are kept). Parameters should already be identical on all ranks (see broadcast_params).
  DataParallelOptimizer(NamedParams params, std::shared_ptr<Comm> comm, DataParallelOptions opts);

  // Averages gradients across ranks (called by step() unless already called since the last zero_grad/step).
  void reduce_gradients();
  // reduce_gradients if needed, global-norm clip, AdamW, refresh compute params on every rank.
  StepResult step(double lr);
  StepResult step() { return step(opts_.lr); }
  // Zeroes the flat gradient buffer (gradients stay attached as views).
  void zero_grad();
  // Copies rank root's parameters to every rank (and refreshes the fp32 master from them).
  void broadcast_params(int root = 0);

  // Bytes allocated for fp32 master + exp_avg + exp_avg_sq on this rank: 12 * P (stage 0) or 12 * ceil(P/N).
  int64_t optimizer_state_bytes() const { return adam_->state_bytes(); }
  // This rank's optimizer state (tensors alias the live state; copy before mutating).
  AdamWShardState state_dict() const;
  // Loads a state covering exactly this rank's range (see reshard_state for other world sizes or stages) and
  // rewrites every rank's compute parameters from the loaded master weights. Collective.
  void load_state_dict(const AdamWShardState& state);

  const FlatParamLayout& layout() const { return layout_; }
  const DataParallelOptions& options() const { return opts_; }
  Comm& comm() const { return *comm_; }
  int64_t step_count() const { return adam_->step_count(); }  // applied (non-skipped) steps
  int64_t skipped_steps() const { return skipped_; }
  // [begin, end) of the flat vector whose optimizer state lives on this rank.
  std::pair<int64_t, int64_t> owned_range() const { return {adam_->begin(), adam_->end()}; }

 private:
  void attach_grads();     // make every param.grad our view again (copying a replaced grad in)
  void write_params();     // master -> compute params of the owned range -> all_gather (stage 1/2)
  void reduce_all();       // stage 0/1
  void reduce_scatter();   // stage 2

  NamedParams params_;
  std::shared_ptr<Comm> comm_;
  DataParallelOptions opts_;
  FlatParamLayout layout_;
  at::Tensor pflat_;   // [padded P] compute params (params' dtype)
  at::Tensor gflat_;   // [padded P] gradients (params' dtype)
  at::Tensor gshard_;  // [owned] fp32 averaged gradient (a view into gflat_ when no conversion is needed)
  bool gshard_is_view_ = false;
  std::unique_ptr<ShardedAdamW> adam_;
  bool reduced_ = false;
  int64_t skipped_ = 0;
};

}  // namespace gmod

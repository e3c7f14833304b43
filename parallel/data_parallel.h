// DataParallelOptimizer: data-parallel training step over a Comm with ZeRO stage 0/1/2 AdamW.
//   stage 0: gradients all-reduced (averaged) in buckets; every rank runs AdamW on the whole vector.
//   stage 1: gradients all-reduced; each rank keeps fp32 master + moments for its shard only, updates it, and the
//            updated shards are all-gathered into every rank's compute parameters.
//   stage 2: gradients reduce-scattered, so each rank only receives its shard's averaged gradient; once a bucket's
//            reduce-scatter has completed (and its owned part is in the fp32 shard) the bucket's gradient memory is
//            released, and re-allocated (zeroed) when the next backward first writes into it (buckets exist only
//            from a window's first backward until their reduction; none during the forward after a step).
// The trainable parameters become views into one flat compute buffer [padded P] and their .grad views into the
// gradient storage of their bucket (stage 0/1: every bucket is a view of one flat buffer; stage 2: one allocation per
// bucket), so backward accumulates in place (gradient accumulation = several backward() calls, then step(); nothing
// is communicated per micro-batch but the last) and the all-gather writes parameters in place.
// Buckets: the flat gradient is cut into buckets of whole parameters in reverse parameter order (~bucket_bytes each,
// the order in which backward finishes them). With overlap_comm, set_last_micro_batch() arms per-parameter
// post-accumulate-grad hooks for the next backward: once every parameter of bucket k has its gradient and buckets
// 0..k-1 were launched, bucket k's reduction starts (non-blocking MPI on a duplicated communicator, or NCCL on a
// dedicated CUDA stream) while backward continues; step() launches whatever is left (parameters that got no
// gradient) in bucket order and waits. The same bucket collectives run without overlap, so results are bitwise
// identical either way. accumulate_fp32 (bf16/fp16 params): hooks fold every micro-batch's gradient into an fp32
// buffer and reset the param's grad, so long accumulation windows keep fp32 precision. Gradient clipping uses
// the global norm (equal to the unsharded one); a non-finite gradient on any rank makes every rank skip the step.
// Weight decay applies to the parameters flagged in DataParallelOptions::decay (the caller decides, e.g. by name).
// No model knowledge: it only sees (name, tensor) pairs; frozen parameters are simply not passed.
//
// Memory per rank besides the compute parameters. P = padded parameter count, P_real = unpadded, N = world size,
// S = P / N = ceil(P_real / N) the shard, b = bytes per element of the params' dtype (2 bf16, 4 fp32), acc32 =
// accumulate_fp32 with non-fp32 params. Bytes:
// Stage 2's buckets are allocated by the first backward of a window that writes into them (so the forward after a
// step holds no gradient buffer) and released in step() as each bucket's reduction completes (MPI); on a CUDA
// communicator a bucket is released as soon as its reduce-scatter is enqueued (stream-ordered; bucket_release.h).
//   buffer                               | stage 0        | stage 1    | stage 2, backward | stage 2, in step()
//   gradient (params' dtype)             | b·P            | b·P        | b·P               | 0 (released)
//   fp32 accumulation (acc32 only)       | 4·P            | 4·P        | 4·P               | 0 (released)
//   fp32 averaged gradient (*)           | 4·P_real or 0  | 4·S or 0   | 4·S               | 4·S
//   fp32 master + exp_avg + exp_avg_sq   | 12·P_real      | 12·S       | 12·S              | 12·S
//   (offload: that row moves to host memory, DpMemory::host_state; a device run adds the host gradient copy 4·S)
//   (*) 0 when it aliases one of the buffers above: fp32 (or acc32) gradients reduced in fp32 at stage 0/1.
// Transient during the reduction: reduce_dtype copies of the chunks in flight when reduce_dtype differs from the
// gradient buffer's dtype (step() keeps at most kMaxInflight chunks of bucket_bytes in flight; with overlap, buckets
// launched during backward stay in flight until step()), and stage 2 receives into a buffer of the chunk's owned
// part when reduce_dtype is not fp32. AdamW's temporaries are bounded by its chunk (sharded_adamw.cpp).
// memory_plan() gives this table for a configuration, memory_held() the live buffers.
#pragma once

#include "parallel/comm.h"
#include "parallel/flat_params.h"
#include "parallel/sharded_adamw.h"

#include <ATen/ATen.h>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
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
  bool overlap_comm = true;      // reduce buckets during the backward after set_last_micro_batch()
  bool accumulate_fp32 = false;  // low-precision params: accumulate gradients in an fp32 buffer
  // Optimizer offload: fp32 master + moments in host memory, AdamW on CPU threads, the updated shard copied back
  // (ShardedAdamW, AdamWHyper::offload). Bitwise the same parameters and state as without.
  bool offload = false;
  // Per parameter, in the order passed: true = weight_decay applies to it. Empty = every parameter.
  std::vector<bool> decay;
  // Parameter groups (torch.optim.AdamW's param_groups; trainer's optimizer.groups): per parameter, in the order
  // passed, its group (empty = all in group 0), and per group the weight decay of its decay-flagged parameters
  // (empty = one group with weight_decay). step(lrs) then takes one learning rate per group.
  std::vector<int> group;
  std::vector<double> group_weight_decay;
};

// Bytes of the optimizer's buffers on one rank (see the table at the top of this file); compute params excluded.
struct DpMemory {
  int64_t grad_buffer = 0;      // gradients in the params' dtype
  int64_t fp32_accum = 0;       // accumulate_fp32 buffer
  int64_t reduced_grad = 0;     // fp32 averaged gradient of the owned range (0 when it aliases a buffer above)
  int64_t optimizer_state = 0;  // fp32 master + exp_avg + exp_avg_sq (0 when offloaded)
  int64_t host_state = 0;       // offload: the same state (+ host gradient copy of a device run) in host memory
  int64_t total() const { return grad_buffer + fp32_accum + reduced_grad + optimizer_state; }  // device side
};

class DpGradHook;

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
  ~DataParallelOptimizer();  // removes the gradient hooks, waits for reductions in flight
  DataParallelOptimizer(const DataParallelOptimizer&) = delete;
  DataParallelOptimizer& operator=(const DataParallelOptimizer&) = delete;

  // Call before the backward of the last micro-batch of an accumulation window (before step()): with
  // overlap_comm its gradient hooks launch bucket reductions during that backward. Earlier micro-batches must not
  // be flagged (their gradients are not complete). No-op without overlap_comm; step()/zero_grad() disarm it.
  void set_last_micro_batch(bool last = true);

  // Averages gradients across ranks (called by step() unless already called since the last zero_grad/step).
  void reduce_gradients();
  // The way to run a collective on comm() between the last backward of a window and step() (the trainer's step
  // statistics): completes the window's bucket reductions first (reduce_gradients(); on CUDA the compute stream then
  // waits for the comm stream), then all-reduces `t` on comm(). With overlap_comm the buckets run on grad_comm(), a
  // second communicator, and NCCL does not guarantee progress when two communicators' collectives run at once.
  void all_reduce_after_gradients(at::Tensor& t, ReduceOp op = ReduceOp::Sum);
  // Bucket collectives started and not yet completed (0 after reduce_gradients(), step() and zero_grad()).
  size_t reductions_in_flight();
  // reduce_gradients if needed, global-norm clip, AdamW, refresh compute params on every rank.
  StepResult step(double lr) { return step(std::vector<double>{lr}); }
  StepResult step() { return step(opts_.lr); }
  // The same with a learning rate per parameter group (DataParallelOptions::group).
  StepResult step(const std::vector<double>& lrs);
  // This rank's averaged fp32 gradient for owned_range() (valid after reduce_gradients()/before the next step's
  // clipping; aliases live state). Stage 2: after the reduction the parameters' .grad are undefined (released).
  const at::Tensor& reduced_gradient() const { return gshard_; }
  // Zeroes the gradients (they stay attached as views). Stage 2 after a step: the released buckets stay released
  // and their parameters' .grad undefined (= zero) until the next backward writes into them.
  void zero_grad();
  // Copies rank root's parameters to every rank (and refreshes the fp32 master from them).
  void broadcast_params(int root = 0);

  // Bytes allocated for fp32 master + exp_avg + exp_avg_sq on this rank: 12 * P (stage 0) or 12 * ceil(P/N).
  int64_t optimizer_state_bytes() const { return adam_->state_bytes(); }
  // What the buffers take for `num_params` (unpadded) parameters of `param_dtype` at world size `world`: during
  // backward (at_step = false) or while step() updates (at_step = true; differs for stage 2 only).
  static DpMemory memory_plan(int64_t num_params, int world, at::ScalarType param_dtype,
                              const DataParallelOptions& opts, bool at_step);
  // Storage bytes of the buffers alive now (each storage counted once).
  DpMemory memory_held() const;
  // This rank's optimizer state (tensors alias the live state; copy before mutating).
  AdamWShardState state_dict() const;
  // Loads a state covering exactly this rank's range (see reshard_state for other world sizes or stages) and
  // rewrites every rank's compute parameters from the loaded master weights. Collective.
  void load_state_dict(const AdamWShardState& state);

  // Buckets in launch order: [begin, end) of the padded flat vector (bucket 0 holds the last parameters + padding).
  const std::vector<std::pair<int64_t, int64_t>>& buckets() const { return bucket_ranges_; }
  // Buckets launched from backward hooks during the last armed backward (the rest were launched by step()).
  int buckets_launched_early() const { return launched_early_; }
  // The communicator that carries bucket reductions (a duplicate of comm() with overlap_comm, else comm()).
  Comm& grad_comm() const { return *gcomm_; }

  const FlatParamLayout& layout() const { return layout_; }
  const DataParallelOptions& options() const { return opts_; }
  Comm& comm() const { return *comm_; }
  int64_t step_count() const { return adam_->step_count(); }  // applied (non-skipped) steps
  int64_t skipped_steps() const { return skipped_; }
  // [begin, end) of the flat vector whose optimizer state lives on this rank.
  std::pair<int64_t, int64_t> owned_range() const { return {adam_->begin(), adam_->end()}; }

 private:
  static constexpr size_t kMaxInflight = 4;  // chunks step() keeps in flight while it launches the rest

  void attach_grads();     // param.grad our view again for unlaunched buckets (copying a replaced grad in)
  void write_params();     // master -> compute params of the owned range -> all_gather (stage 1/2)
  friend class DpGradHook;
  struct CudaState;
  struct Inflight {
    std::unique_ptr<CommRequest> req;
    at::Tensor red;         // stage 0/1: the reduced chunk (reduce_dtype)
    at::Tensor out;         // stage 2: our block of the chunk (a view of gshard_ when `direct`)
    int64_t begin = 0;      // flat start of red (stage 0/1) or out (stage 2)
    int bucket = 0;
    bool last = false;      // the bucket's last chunk
    bool direct = false;    // out is gshard_'s storage: nothing to copy
  };
  void on_grad_ready(size_t index, const at::Tensor& param);  // post-accumulate-grad hook
  void launch(int bucket, bool flush);  // start bucket's collectives (mu_ held)
  void retire_front();                  // wait for the oldest collective, copy into gshard_, release (mu_ held)
  void finish_all();                    // launch the rest in order, wait, copy into gshard_ (mu_ held)
  void ensure_bucket(int bucket);       // stage 2: (re)allocate a released bucket's storage, zeroed
  void release_bucket(int bucket);      // stage 2: drop the bucket's storage and its parameters' .grad
  at::Tensor grad_view(size_t index) const;  // [numel] the parameter's part of its bucket's gradient storage
  at::Tensor acc_view(size_t index) const;   // same in the fp32 accumulation storage
  void reset_readiness();
  void install_hooks();
  void remove_hooks();

  NamedParams params_;
  std::shared_ptr<Comm> comm_;
  DataParallelOptions opts_;
  FlatParamLayout layout_;
  bool acc32_ = false;  // accumulate_fp32 with non-fp32 params
  at::Tensor pflat_;    // [padded P] compute params (params' dtype)
  at::Tensor gflat_;    // stage 0/1: [padded P] gradients (params' dtype); stage 2: undefined (per bucket)
  at::Tensor gacc_;     // stage 0/1 with acc32: [padded P] fp32 accumulated gradients
  std::vector<at::Tensor> bucket_grad_;  // per bucket [hi - lo] (views of gflat_ at stage 0/1; undefined = released)
  std::vector<at::Tensor> bucket_acc_;   // per bucket [hi - lo] fp32 (acc32 only)
  std::shared_ptr<Comm> gcomm_;
  at::Tensor gshard_;  // [owned] fp32 averaged gradient (a view into gflat_/gacc_ when no conversion is needed)
  bool gshard_is_view_ = false;
  std::unique_ptr<ShardedAdamW> adam_;
  bool reduced_ = false;
  int64_t skipped_ = 0;

  std::vector<std::pair<int64_t, int64_t>> bucket_ranges_;
  std::vector<int> bucket_of_;                       // per parameter
  std::vector<std::vector<size_t>> bucket_members_;  // parameter indices per bucket
  std::vector<int> pending_;        // parameters still without gradient, per bucket (armed backward)
  std::vector<char> ready_;         // per parameter
  int next_launch_ = 0;
  int launched_early_ = 0;
  bool hooks_installed_ = false;
  std::atomic<bool> armed_{false};
  std::mutex mu_;  // bucket state, bucket storage and every collective on gcomm_ issued from hooks
  std::deque<Inflight> inflight_;
  std::unique_ptr<CudaState> cuda_;
};

}  // namespace gmod

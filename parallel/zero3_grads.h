// Zero3Grads: the gradient half of ZeRO-3, next to Zero3Params. Each unit's gradient lives in its own buffer
// only from its first backward of an accumulation window until its reduction: attach(u) allocates it zeroed
// and points the unit's parameters' .grad into it (before the unit's backward, so autograd accumulates in
// place), reduce_start(u) starts its reduce-scatter (average over ranks, in reduce_dtype) into this rank's
// fp32 gradient shard — the same [r*S, (r+1)*S) range and the same per-element reduction as ZeRO-2's buckets
// — and drops the buffer (the started collective keeps what it reads alive until it completes);
// poll()/finish() complete them. So a rank holds its fp32 gradient shard plus the gradients of the units
// whose backward is running or whose reduction is in flight. Reductions can run on their own communicator
// (the constructor's reduce_comm), so that the order in which a rank interleaves them with parameter gathers
// (which depends on when its units' backward ends) never has to match the other ranks'; only the reductions'
// own order must.
// CUDA: reductions run on a reduction stream (from the pool) that first waits for an event of the compute
// stream; the unit's gradient buffer is recordStream'ed to it and dropped at once (the caching allocator
// reuses the block only after the reduction stream passed it), the reduce-dtype copy and the received block
// live on that stream, and finish() makes the compute stream wait for it before anything reads shard_grad().
#pragma once

#include <ATen/ATen.h>

#include <deque>
#include <memory>
#include <vector>

#include "parallel/zero3_params.h"

namespace gmod {

class Zero3Grads {
 public:
  // reduce_comm: the communicator of the reductions (nullptr: the parameters' own, params.comm()).
  Zero3Grads(Zero3Params& params, at::ScalarType reduce_dtype = at::kFloat,
             std::shared_ptr<Comm> reduce_comm = nullptr);
  ~Zero3Grads();  // waits for reductions in flight

  // Local: unit u's gradient buffer, zeroed, with its parameters' .grad views into it (no-op when attached).
  void attach(int u);
  // Collective on the reduction communicator (every rank, same order): starts averaging unit u's gradient
  // over ranks into shard_grad() (added to what is there; a window reduces each unit once, after its last
  // backward) and drops the buffer and the parameters' .grad. A unit none of whose parameters got a gradient
  // joins with zeros.
  void reduce_start(int u);
  // Completes the reductions that have finished (in start order; never blocks).
  void poll();
  // Moves the reductions in flight on (MPI progresses them only inside MPI calls) without completing any:
  // what they hold stays allocated until poll(), finish() or limit_in_flight() (so when it is freed does not
  // depend on the peers' timing). Never blocks.
  void progress();
  // Waits for every started reduction; shard_grad() is complete afterwards.
  void finish();
  // Waits for the oldest reductions until at most n are in flight (bounds the gradient memory they hold).
  void limit_in_flight(size_t n);
  // reduce_start(u) + finish().
  void reduce(int u);
  bool attached(int u) const { return bool(grad_.at(size_t(u)).defined()); }
  size_t in_flight() const { return inflight_.size(); }
  Comm& reduce_comm() const { return rcomm_ ? *rcomm_ : params_.comm(); }
  // [S] fp32: this rank's averaged gradient of layout().shard_range(rank).
  at::Tensor& shard_grad() { return gshard_; }
  const at::Tensor& shard_grad() const { return gshard_; }
  void zero_shard_grad() { gshard_.zero_(); }
  // Bytes of gradient storage alive: the fp32 shard plus the attached units' buffers.
  int64_t bytes_held() const;

 private:
  struct Inflight {
    std::unique_ptr<CommRequest> req;
    at::Tensor out;     // this rank's block (reduce_dtype)
    int64_t begin = 0;  // its start in shard coordinates
  };
  void retire_front();
  struct CudaState;

  std::unique_ptr<CudaState> cuda_;  // CUDA parameters: the reduction stream
  Zero3Params& params_;
  at::ScalarType reduce_dtype_;
  std::shared_ptr<Comm> rcomm_;   // null: params_.comm()
  std::vector<at::Tensor> grad_;  // per unit [end - begin], undefined when not attached
  std::vector<std::vector<size_t>> members_;
  at::Tensor gshard_;  // [S] fp32
  std::deque<Inflight> inflight_;
};

}  // namespace gmod

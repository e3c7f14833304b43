// Comm: the collective-communication interface used by data parallelism and ZeRO. Backends: MpiComm (CPU tensors,
// parallel/mpi_comm.h) and NcclComm (CUDA tensors, parallel/nccl_comm.h). Tensors passed in must be contiguous and
// live on the backend's device; all ranks must call the same collectives in the same order with the same sizes.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gmod {

enum class ReduceOp { Sum, Avg, Max };

const char* to_string(ReduceOp op);

// Traffic counters, per rank. `payload_bytes` counts the buffer each collective works on (all_reduce: the tensor,
// reduce_scatter: the full input, all_gather: the full output, broadcast: the tensor); `wire_bytes` estimates what
// one rank sends with ring algorithms (all_reduce 2(N-1)/N, reduce_scatter and all_gather (N-1)/N of the payload).
struct CommStats {
  int64_t calls = 0;
  int64_t payload_bytes = 0;
  double wire_bytes = 0;
};

// A started non-blocking collective. wait() completes it, including any post-processing (Avg's division, the
// copy back of an upcast); test() only drives progress and says whether wait() would return at once. Its tensors
// must not be touched until wait() returned. Destroying an unfinished request waits for it.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
  virtual bool test() { return false; }
};

// A request that is already complete (for backends whose "blocking" calls are asynchronous anyway).
std::unique_ptr<CommRequest> completed_request();

class Comm {
 public:
  virtual ~Comm() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual int local_rank() const = 0;
  // The device whose tensors this backend moves (kCPU for MPI, the rank's CUDA device for NCCL).
  virtual at::Device device() const = 0;
  virtual std::string backend() const = 0;

  // In place on every rank.
  virtual void all_reduce(at::Tensor& t, ReduceOp op = ReduceOp::Sum) = 0;
  // in: [world * n] (rank k's block is in[k*n, (k+1)*n)), out: [n] = reduction of every rank's block `rank()`.
  virtual void reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op = ReduceOp::Sum) = 0;
  // in: [n], out: [world * n] with rank k's `in` at out[k*n, (k+1)*n). In place when in is that block of out.
  virtual void all_gather(const at::Tensor& in, at::Tensor& out) = 0;
  virtual void broadcast(at::Tensor& t, int root) = 0;
  virtual void barrier() = 0;

  // Reduce-scatter with uneven blocks: in [sum(counts)] (counts.size() == world), rank k receives the reduction of
  // every rank's in[off_k, off_k + counts[k]) in out [counts[k]] (off_k = counts[0] + ... + counts[k-1]).
  void reduce_scatter_v(const at::Tensor& in, at::Tensor& out, const std::vector<int64_t>& counts,
                        ReduceOp op = ReduceOp::Sum);

  // Non-blocking forms: start now, complete at CommRequest::wait(). All ranks must start collectives on one Comm in
  // the same order (blocking ones included). The defaults run the blocking collective and return a finished
  // request (NCCL: already asynchronous to the host, enqueued on the current CUDA stream).
  virtual std::unique_ptr<CommRequest> all_reduce_start(at::Tensor t, ReduceOp op = ReduceOp::Sum);
  // out must not overlap in. Default: all_reduce of a copy of `in`, then our block copied out.
  virtual std::unique_ptr<CommRequest> reduce_scatter_v_start(at::Tensor in, at::Tensor out,
                                                              std::vector<int64_t> counts,
                                                              ReduceOp op = ReduceOp::Sum);
  // All-gather with uneven blocks, in place and non-blocking: buf [sum(counts)] (counts.size() == world), rank
  // k's block at off_k = counts[0] + ... + counts[k-1], written by rank k before the call; every block is in
  // buf once the request's wait() returned (until then buf is not to be touched). MPI: MPI_Iallgatherv (the
  // request keeps buf alive); NCCL: grouped broadcasts on the communicator's gather stream after an event of
  // the current stream, buf recordStream'ed to it, wait() makes the then-current stream wait for it. Default:
  // one blocking broadcast per non-empty block, a finished request.
  virtual std::unique_ptr<CommRequest> all_gather_v_start(at::Tensor buf, std::vector<int64_t> counts);
  // A new communicator over the same ranks and device whose collectives never mix with this one's (so a
  // background stream of collectives can run while other code uses this Comm). Collective.
  virtual std::shared_ptr<Comm> duplicate() const = 0;

  // Scalar helper (a host value; goes through a one-element tensor on device()).
  double all_reduce(double v, ReduceOp op);

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }

 protected:
  // Throws unless counts has world_size() non-negative entries summing to buf.numel() (all_gather_v_start).
  void check_gather_counts(const at::Tensor& buf, const std::vector<int64_t>& counts) const;
  // Throws unless counts has world_size() entries summing to in.numel() and out has counts[rank()] elements.
  void check_counts(const at::Tensor& in, const at::Tensor& out, const std::vector<int64_t>& counts) const;
  void count(int64_t payload_bytes, double wire_factor);
  // Throws std::runtime_error naming the collective unless t is contiguous and on device().
  void check_tensor(const at::Tensor& t, const char* what) const;

 private:
  CommStats stats_;
};

}  // namespace gmod

// MpiComm: the Comm backend for CPU tensors over MPI (OpenMPI). fp32/fp64/int32/int64 reduce natively; bf16/fp16 are
// reduced in fp32 (MPI has no bf16 type) and cast back; gathers and broadcasts move any dtype as raw elements.
// Counts above the MPI `int` limit are split into chunks (the limit is settable so tests can exercise chunking).
// Every collective runs as its non-blocking form, completed by watchdog_wait_mpi under the parallel.timeout_s
// deadline (parallel/watchdog.h); MPI errors on our communicator are return codes, thrown naming the collective.
#pragma once

#include "parallel/comm.h"
#include "parallel/watchdog.h"

#include <mpi.h>

namespace gmod {

// The rank of this process among the ranks of `comm` on its node (MPI_Comm_split_type SHARED, ordered by `rank`):
// the local rank, which picks the GPU (NcclComm) and which gmod train's banner prints (local_rank()). Computed here
// only, so what a multi-node test sees in the banner is what the communicators use. `wait` names the split for the
// watchdog. Collective over `comm`.
int node_local_rank(MPI_Comm comm, int rank, const CollectiveId& wait);

class MpiComm final : public Comm {
 public:
  // Duplicates `parent` (MPI_COMM_WORLD by default) so our collectives never mix with other MPI traffic.
  // MPI must be initialised (parallel/runtime.h).
  explicit MpiComm(MPI_Comm parent = MPI_COMM_WORLD);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  int local_rank() const override { return local_rank_; }
  at::Device device() const override { return at::Device(at::kCPU); }
  std::string backend() const override { return "mpi"; }

  using Comm::all_reduce;
  void all_reduce(at::Tensor& t, ReduceOp op = ReduceOp::Sum) override;
  void reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op = ReduceOp::Sum) override;
  void all_gather(const at::Tensor& in, at::Tensor& out) override;
  void broadcast(at::Tensor& t, int root) override;
  void barrier() override;
  // MPI_Iallreduce / MPI_Ireduce_scatter (bf16/fp16 through an fp32 copy); chunked like the blocking forms.
  std::unique_ptr<CommRequest> all_reduce_start(at::Tensor t, ReduceOp op = ReduceOp::Sum) override;
  std::unique_ptr<CommRequest> reduce_scatter_v_start(at::Tensor in, at::Tensor out, std::vector<int64_t> counts,
                                                      ReduceOp op = ReduceOp::Sum) override;
  // MPI_Iallgatherv in place; blocks above max_count go through the blocking chunked broadcasts instead.
  std::unique_ptr<CommRequest> all_gather_v_start(at::Tensor buf, std::vector<int64_t> counts) override;
  // MPI_Comm_dup of ours (same max_count).
  std::shared_ptr<Comm> duplicate() const override;

  MPI_Comm handle() const { return comm_; }
  // Largest element count passed to one MPI call (default INT_MAX).
  void set_max_count(int64_t n);

 private:
  void all_reduce_native(at::Tensor& t, ReduceOp op);
  void reduce_scatter_native(const at::Tensor& in, at::Tensor& out, ReduceOp op);
  CollectiveId next_id(const char* what) { return CollectiveId{what, id_, ++seq_}; }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, world_ = 1, local_rank_ = 0;
  int64_t max_count_;
  int id_ = 0;       // next_comm_id() at construction
  int64_t seq_ = 0;  // collectives started on comm_
};

}  // namespace gmod

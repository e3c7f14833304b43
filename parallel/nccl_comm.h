// NcclComm: the Comm backend for CUDA tensors over NCCL, bootstrapped over MPI (rank 0 makes the unique id and
// broadcasts it). One GPU per rank: the constructor selects local_rank % device_count (or the given index) with
// c10::cuda::set_device before any other CUDA call. Collectives are enqueued on the current CUDA stream, so they are
// ordered after the kernels that produced their inputs and before later consumers without extra synchronisation.
// bf16 is reduced natively (ncclBfloat16). Compiled only with GMOD_WITH_CUDA.
// Watchdog (parallel/watchdog.h): an event is recorded after every collective; the watchdog thread polls the events
// and ncclCommGetAsyncError, and on an error or a collective pending longer than parallel.timeout_s names it,
// ncclCommAbort's the communicator and aborts the job. barrier() polls the same way on the calling thread. Every MPI
// call of the bootstrap is checked (MPI_ERRORS_RETURN on our duplicate), the unique-id broadcast is deadline-polled.
#pragma once

#ifdef GMOD_WITH_CUDA

#include "parallel/comm.h"
#include "parallel/watchdog.h"

#include <mpi.h>

#include <deque>
#include <mutex>

struct ncclComm;

namespace gmod {

class NcclComm final : public Comm, private WatchdogClient {
 public:
  // device_index < 0: local_rank % device_count.
  explicit NcclComm(MPI_Comm parent = MPI_COMM_WORLD, int device_index = -1);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  int local_rank() const override { return local_rank_; }
  at::Device device() const override { return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_)); }
  std::string backend() const override { return "nccl"; }

  using Comm::all_reduce;
  void all_reduce(at::Tensor& t, ReduceOp op = ReduceOp::Sum) override;
  void reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op = ReduceOp::Sum) override;
  void all_gather(const at::Tensor& in, at::Tensor& out) override;
  void broadcast(at::Tensor& t, int root) override;
  // Waits for this rank's current stream, then MPI_Barrier.
  void barrier() override;
  // Grouped ncclReduce, one per non-empty block, to its owner (enqueued on the current stream).
  std::unique_ptr<CommRequest> reduce_scatter_v_start(at::Tensor in, at::Tensor out, std::vector<int64_t> counts,
                                                      ReduceOp op = ReduceOp::Sum) override;
  // A new NCCL communicator on the same device (bootstrapped over our MPI communicator).
  std::shared_ptr<Comm> duplicate() const override;

 private:
  void* stream() const;  // cudaStream_t of the current stream on our device
  // After enqueueing a collective: an event on the current stream, timed by the watchdog.
  void track(const char* what);
  // WatchdogClient (watchdog thread): async errors, completed events dropped, the oldest one past the deadline.
  std::string poll(double timeout_s) override;
  void abort() override;
  std::string check_locked(double timeout_s);  // mu_ held

  struct Pending {
    void* event;  // cudaEvent_t
    CollectiveId id;
    int64_t step;
    double enqueued;
  };
  std::mutex mu_;  // comm_ (against abort), pending_
  std::deque<Pending> pending_;
  bool aborted_ = false;
  int id_ = 0;
  int64_t seq_ = 0;
  ncclComm* comm_ = nullptr;
  MPI_Comm mpi_ = MPI_COMM_NULL;
  int rank_ = 0, world_ = 1, local_rank_ = 0, device_ = 0;
};

}  // namespace gmod

#endif  // GMOD_WITH_CUDA

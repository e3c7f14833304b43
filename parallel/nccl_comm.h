// NcclComm: the Comm backend for CUDA tensors over NCCL, bootstrapped over MPI (rank 0 makes the unique id and
// broadcasts it). One GPU per rank: the constructor selects local_rank % device_count (or the given index) with
// c10::cuda::set_device before any other CUDA call. Collectives are enqueued on the current CUDA stream, so they are
// ordered after the kernels that produced their inputs and before later consumers without extra synchronisation.
// bf16 is reduced natively (ncclBfloat16). Compiled only with GMOD_WITH_CUDA.
// Watchdog (parallel/watchdog.h): the communicator is non-blocking (ncclCommInitRankConfig, blocking = 0), so neither
// its creation nor a collective that must first connect to its peers blocks the host: a call answering
// ncclInProgress is polled (ncclCommGetAsyncError) under the deadline, which starts before the call. An event is
// recorded after every collective; the watchdog thread polls the events and ncclCommGetAsyncError, and on an error or
// a collective pending longer than its deadline (counted from before the enqueue) names it, and the watchdog
// ncclCommAbort's the communicator (bounded: WatchdogOptions::abort_s) and aborts the job. barrier() polls the same
// way on the calling thread. Every MPI call of the bootstrap is checked (MPI_ERRORS_RETURN on our duplicate), the
// unique-id broadcast is deadline-polled.
#pragma once

#ifdef GMOD_WITH_CUDA

#include "parallel/comm.h"
#include "parallel/watchdog.h"

#include <mpi.h>

#include <c10/core/Stream.h>

#include <atomic>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>

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
  // Grouped ncclBroadcast of every non-empty block on this communicator's gather stream (a pool stream), which
  // first waits for an event of the current stream; buf is recordStream'ed to the gather stream (the caching
  // allocator reuses its block only after the gather stream passed it) and wait() makes the current stream
  // wait for the gather's event. Ops of one NCCL communicator run in issue order whatever their stream, so
  // every rank must start them in the same order (as for every collective).
  std::unique_ptr<CommRequest> all_gather_v_start(at::Tensor buf, std::vector<int64_t> counts) override;
  // A new NCCL communicator on the same device (bootstrapped over our MPI communicator).
  std::shared_ptr<Comm> duplicate() const override;

 private:
  void* stream() const;  // cudaStream_t of the current stream on our device
  // Runs `call` (one NCCL enqueue, or a group ending in ncclGroupEnd) and, while the communicator reports
  // ncclInProgress (connection setup), polls it until the deadline counted from before the call; then track().
  void enqueue(const char* what, const std::function<int()>& call);
  // Polls ncclCommGetAsyncError while it answers ncclInProgress; past t0 + timeout: watchdog_fail naming `what`.
  int settle(int rc, const char* what, double t0, double timeout);
  // After enqueueing a collective: an event on the current stream, timed by the watchdog from t0.
  void track(const char* what, double t0, double timeout, std::string deadline);
  // WatchdogClient (watchdog thread): async errors, completed events dropped, the oldest one past the deadline.
  std::string poll(double timeout_s) override;
  void abort() override;
  std::string check_locked(double timeout_s);  // mu_ held

  struct Pending {
    void* event;  // cudaEvent_t
    CollectiveId id;
    int64_t step;
    double enqueued;      // before the NCCL call (its connection setup counts)
    double timeout;       // the deadline in force then (a phase's, or parallel.timeout_s)
    std::string deadline; // deadline_text() then
  };
  std::mutex mu_;  // comm_ (against abort), pending_
  std::deque<Pending> pending_;
  std::atomic<bool> aborted_{false};  // set by the watchdog's abort thread, read by every other
  int id_ = 0;
  int64_t seq_ = 0;
  std::optional<c10::Stream> gather_stream_;  // all_gather_v_start's stream, from the pool on first use
  ncclComm* comm_ = nullptr;
  MPI_Comm mpi_ = MPI_COMM_NULL;
  int rank_ = 0, world_ = 1, local_rank_ = 0, device_ = 0;
};

}  // namespace gmod

#endif  // GMOD_WITH_CUDA

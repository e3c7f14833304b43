#ifdef GMOD_WITH_CUDA

#include "parallel/nccl_comm.h"

#include "parallel/mpi_comm.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>

namespace gmod {
namespace {

void check_nccl(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess)
    throw std::runtime_error(std::string("parallel/nccl_comm: ") + what +
                             " failed: " + ncclGetErrorString(rc));
}

void nccl_check_mpi(int rc, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error("parallel/nccl_comm: " + what + " failed: " + std::string(msg, size_t(len)));
}

void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess)
    throw std::runtime_error(std::string("parallel/nccl_comm: ") + what +
                             " failed: " + cudaGetErrorString(rc));
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string secs(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f s", s);
  return b;
}

ncclDataType_t nccl_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    case at::kByte:
      return ncclUint8;
    case at::kChar:
      return ncclInt8;
    default:
      throw std::runtime_error(std::string("parallel/nccl_comm: unsupported dtype ") + c10::toString(t));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Avg:
      return ncclAvg;
    case ReduceOp::Max:
      return ncclMax;
  }
  return ncclSum;
}

// A gather started on the gather stream: wait() orders the then-current stream after its event (the host does
// not block), test() says whether the device has passed it.
class NcclStreamRequest final : public CommRequest {
 public:
  NcclStreamRequest(cudaEvent_t done, c10::DeviceIndex device) : done_(done), device_(device) {}
  ~NcclStreamRequest() override {
    try {
      wait();
    } catch (...) {
    }
    cudaEventDestroy(done_);
  }
  void wait() override {
    if (waited_) return;
    waited_ = true;
    check_cuda(cudaStreamWaitEvent(c10::cuda::getCurrentCUDAStream(device_).stream(), done_, 0),
               "cudaStreamWaitEvent (all_gather_v_start)");
  }
  bool test() override { return cudaEventQuery(done_) == cudaSuccess; }

 private:
  cudaEvent_t done_;
  c10::DeviceIndex device_;
  bool waited_ = false;
};

}  // namespace

NcclComm::NcclComm(MPI_Comm parent, int device_index) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited)
    throw std::runtime_error("parallel/nccl_comm: MPI is not initialised (call gmod::Runtime first)");
  {
    // The libnccl loaded at run time (LD_LIBRARY_PATH may pick the wheel's or the toolkit's) must be the major
    // version gmod was compiled against: the API and its enums change between majors.
    int v = 0;
    if (ncclGetVersion(&v) == ncclSuccess && v / 10000 != NCCL_MAJOR)
      throw std::runtime_error("parallel/nccl_comm: the loaded NCCL is " + std::to_string(v / 10000) + "." +
                               std::to_string(v / 100 % 100) + ", gmod was built against NCCL " +
                               std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) +
                               " (a different major version): put the matching libnccl first on LD_LIBRARY_PATH");
  }
  {
    MPI_Request req;
    const CollectiveId id{"bootstrap (MPI_Comm_idup)", 0, 0};
    nccl_check_mpi(MPI_Comm_idup(parent, &mpi_, &req), describe(id));
    watchdog_wait_mpi(1, &req, id);
  }
  nccl_check_mpi(MPI_Comm_set_errhandler(mpi_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  id_ = next_comm_id();
  nccl_check_mpi(MPI_Comm_rank(mpi_, &rank_), "MPI_Comm_rank");
  nccl_check_mpi(MPI_Comm_size(mpi_, &world_), "MPI_Comm_size");
  local_rank_ = node_local_rank(mpi_, rank_, CollectiveId{"bootstrap (MPI_Comm_split_type)", id_, 0});

  const int ndev = static_cast<int>(c10::cuda::device_count());
  if (ndev == 0)
    throw std::runtime_error("parallel/nccl_comm: no CUDA device visible on rank " + std::to_string(rank_));
  device_ = device_index >= 0 ? device_index : local_rank_ % ndev;
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_));

  ncclUniqueId uid;
  if (rank_ == 0) check_nccl(ncclGetUniqueId(&uid), "ncclGetUniqueId");
  const CollectiveId bcast{"bootstrap (MPI_Ibcast of the NCCL unique id)", id_, ++seq_};
  MPI_Request req;
  nccl_check_mpi(MPI_Ibcast(&uid, sizeof(uid), MPI_BYTE, 0, mpi_, &req), describe(bcast));
  watchdog_wait_mpi(1, &req, bcast);
  // Non-blocking: creation (and later the connection setup inside a first collective) answers ncclInProgress
  // instead of blocking, and is polled under the deadline here; a blocked peer cannot hold this rank beyond
  // it, and ncclCommAbort never has to interrupt a thread stuck inside NCCL.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const double t0 = now_s(), timeout = collective_timeout();
  const int rc = ncclCommInitRankConfig(&comm_, world_, uid, rank_, &config);
  check_nccl(static_cast<ncclResult_t>(settle(rc, "bootstrap (ncclCommInitRankConfig)", t0, timeout)),
             "ncclCommInitRankConfig");
  ++seq_;
  watchdog_register(this);
}

NcclComm::~NcclComm() {
  watchdog_unregister(this);
  for (auto& p : pending_) cudaEventDestroy(static_cast<cudaEvent_t>(p.event));
  if (comm_ && !aborted_.exchange(true)) {
    // Non-blocking communicator: finalize, poll until quiescent (bounded), then destroy; abort when it does
    // not settle (a peer gone), which frees it without waiting for peers.
    ncclResult_t rc = ncclCommFinalize(comm_);
    const double t0 = now_s(), limit = collective_timeout();
    ncclResult_t state = rc;
    while (state == ncclInProgress && now_s() - t0 < limit) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
    }
    if (state == ncclSuccess)
      ncclCommDestroy(comm_);
    else
      ncclCommAbort(comm_);
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && mpi_ != MPI_COMM_NULL) MPI_Comm_free(&mpi_);
}

void* NcclComm::stream() const {
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
}

int NcclComm::settle(int rc, const char* what, double t0, double timeout) {
  ncclResult_t state = static_cast<ncclResult_t>(rc);
  for (long it = 0; state == ncclInProgress; ++it) {
    if (now_s() - t0 > timeout) {
      const CollectiveId id{what, id_, seq_ + 1};
      watchdog_fail(describe(id) + ": NCCL did not finish setting it up (connecting to the peers) within " +
                        deadline_text(),
                    &id);
    }
    if (it > 1000) std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (!comm_) break;  // ncclCommInitRankConfig failed before creating the communicator
    // The watchdog may have aborted (and be freeing) comm_ meanwhile: it sets aborted_ first, so stop touching it.
    if (aborted_.load())
      throw std::runtime_error(describe(CollectiveId{what, id_, seq_ + 1}) +
                               ": the communicator was aborted (watchdog) while NCCL was still setting it up");
    const ncclResult_t q = ncclCommGetAsyncError(comm_, &state);
    if (q != ncclSuccess) return q;
  }
  return state;
}

void NcclComm::enqueue(const char* what, const std::function<int()>& call) {
  const double t0 = now_s(), timeout = collective_timeout();
  std::string deadline = deadline_text();
  check_nccl(static_cast<ncclResult_t>(settle(call(), what, t0, timeout)), what);
  track(what, t0, timeout, std::move(deadline));
}

void NcclComm::track(const char* what, double t0, double timeout, std::string deadline) {
  cudaEvent_t ev;
  check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  check_cuda(cudaEventRecord(ev, static_cast<cudaStream_t>(stream())), "cudaEventRecord");
  std::lock_guard<std::mutex> lock(mu_);
  // Drop what has completed, so the queue stays short even when no watchdog thread polls it.
  while (!pending_.empty() &&
         cudaEventQuery(static_cast<cudaEvent_t>(pending_.front().event)) == cudaSuccess) {
    cudaEventDestroy(static_cast<cudaEvent_t>(pending_.front().event));
    pending_.pop_front();
  }
  pending_.push_back(
      Pending{ev, CollectiveId{what, id_, ++seq_}, watchdog_step(), t0, timeout, std::move(deadline)});
}

std::string NcclComm::check_locked(double timeout_s) {
  if (aborted_.load()) return "";
  ncclResult_t async = ncclSuccess;
  // ncclInProgress is not an error: the calling thread is settling a call (connection setup) under its
  // deadline.
  if (comm_ && ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
      async != ncclInProgress) {
    std::string m = std::string("NCCL asynchronous error on communicator ") + std::to_string(id_) + ": " +
                    ncclGetErrorString(async);
    if (!pending_.empty()) m += " (oldest pending: " + describe(pending_.front().id) + ")";
    return m;
  }
  while (!pending_.empty()) {
    const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(pending_.front().event));
    if (e == cudaErrorNotReady) break;
    if (e != cudaSuccess)
      return "CUDA error while " + describe(pending_.front().id) + " was pending: " + cudaGetErrorString(e);
    cudaEventDestroy(static_cast<cudaEvent_t>(pending_.front().event));
    pending_.pop_front();
  }
  if (!pending_.empty()) {
    const Pending& p = pending_.front();
    const double age = now_s() - p.enqueued;
    (void)timeout_s;  // each collective keeps the deadline in force when it was enqueued (phases differ)
    if (age > p.timeout)
      return describe(p.id) + " (enqueued at step " + std::to_string(p.step) + ") has not completed after " +
             secs(age) + " (" + p.deadline + ")";
  }
  return "";
}

std::string NcclComm::poll(double timeout_s) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  std::lock_guard<std::mutex> lock(mu_);
  return check_locked(timeout_s);
}

void NcclComm::abort() {
  // Called once, from the watchdog's abort thread (bounded by the watchdog: ncclCommAbort may block).
  // aborted_ first, so that poll() and the destructor leave comm_ alone; mu_ if it can be had within 1 s, so
  // that no poll() is inside ncclCommGetAsyncError on comm_ while it is freed (a thread stuck while holding
  // it must not stop the abort).
  if (!comm_ || aborted_.exchange(true)) return;
  std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
  const double t0 = now_s();
  while (!lock.try_lock() && now_s() - t0 < 1.0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ncclCommAbort(comm_);
}

void NcclComm::all_reduce(at::Tensor& t, ReduceOp op) {
  check_tensor(t, "all_reduce");
  count(t.numel() * t.element_size(), world_ > 1 ? 2.0 * (world_ - 1) / world_ : 0.0);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  enqueue("all_reduce (ncclAllReduce)", [&] {
    return ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()),
                         nccl_type(t.scalar_type()), nccl_op(op), comm_, static_cast<cudaStream_t>(stream()));
  });
}

void NcclComm::reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) {
  check_tensor(in, "reduce_scatter(in)");
  check_tensor(out, "reduce_scatter(out)");
  if (in.numel() != world_ * out.numel() || in.scalar_type() != out.scalar_type())
    throw std::runtime_error(
        "parallel/nccl_comm: reduce_scatter needs in.numel() == world * out.numel() and equal "
        "dtypes");
  count(in.numel() * in.element_size(), world_ > 1 ? double(world_ - 1) / world_ : 0.0);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  enqueue("reduce_scatter (ncclReduceScatter)", [&] {
    return ncclReduceScatter(in.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()),
                             nccl_type(in.scalar_type()), nccl_op(op), comm_,
                             static_cast<cudaStream_t>(stream()));
  });
}

std::unique_ptr<CommRequest> NcclComm::reduce_scatter_v_start(at::Tensor in, at::Tensor out,
                                                              std::vector<int64_t> counts, ReduceOp op) {
  check_tensor(in, "reduce_scatter_v_start(in)");
  check_tensor(out, "reduce_scatter_v_start(out)");
  check_counts(in, out, counts);
  count(in.numel() * in.element_size(), world_ > 1 ? double(world_ - 1) / world_ : 0.0);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  const auto st = static_cast<cudaStream_t>(stream());
  const size_t es = static_cast<size_t>(in.element_size());
  char* base = static_cast<char*>(in.data_ptr());
  enqueue("reduce_scatter_v_start (grouped ncclReduce)", [&] {
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    int64_t off = 0;
    for (int k = 0; k < world_; ++k) {
      if (counts[k] > 0) {
        const ncclResult_t rc =
            ncclReduce(base + off * es, k == rank_ ? out.data_ptr() : nullptr, static_cast<size_t>(counts[k]),
                       nccl_type(in.scalar_type()), nccl_op(op), k, comm_, st);
        if (rc != ncclSuccess && rc != ncclInProgress) {
          ncclGroupEnd();
          check_nccl(rc, "ncclReduce");
        }
      }
      off += counts[k];
    }
    return ncclGroupEnd();  // ncclInProgress while a non-blocking communicator connects
  });
  return completed_request();  // stream-ordered: nothing left to wait for on the host
}

std::unique_ptr<CommRequest> NcclComm::all_gather_v_start(at::Tensor buf, std::vector<int64_t> counts) {
  check_tensor(buf, "all_gather_v_start");
  check_gather_counts(buf, counts);
  count(buf.numel() * buf.element_size(), world_ > 1 ? double(world_ - 1) / world_ : 0.0);
  const auto dev = static_cast<c10::DeviceIndex>(device_);
  c10::cuda::CUDAGuard guard(dev);
  if (!gather_stream_) gather_stream_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, dev).unwrap();
  const c10::cuda::CUDAStream side(*gather_stream_);
  // The gather stream starts after what the current stream has queued (the buffer's allocation, our block).
  cudaEvent_t ready, done;
  check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  check_cuda(cudaEventRecord(ready, c10::cuda::getCurrentCUDAStream(dev).stream()), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(side.stream(), ready, 0), "cudaStreamWaitEvent");
  cudaEventDestroy(ready);  // (freed once the recorded work is done)
  c10::cuda::CUDACachingAllocator::recordStream(buf.storage().data_ptr(), side);
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    char* base = static_cast<char*>(buf.data_ptr());
    const size_t es = static_cast<size_t>(buf.element_size());
    enqueue("all_gather_v_start (grouped ncclBroadcast)", [&] {
      check_nccl(ncclGroupStart(), "ncclGroupStart");
      int64_t off = 0;
      for (int k = 0; k < world_; ++k) {
        if (counts[size_t(k)] > 0) {
          const ncclResult_t rc =
              ncclBroadcast(base + off * es, base + off * es, static_cast<size_t>(counts[size_t(k)]),
                            nccl_type(buf.scalar_type()), k, comm_, side.stream());
          if (rc != ncclSuccess && rc != ncclInProgress) {
            ncclGroupEnd();
            check_nccl(rc, "ncclBroadcast");
          }
        }
        off += counts[size_t(k)];
      }
      return ncclGroupEnd();
    });
  }
  check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  check_cuda(cudaEventRecord(done, side.stream()), "cudaEventRecord");
  return std::make_unique<NcclStreamRequest>(done, dev);
}

std::shared_ptr<Comm> NcclComm::duplicate() const { return std::make_shared<NcclComm>(mpi_, device_); }

void NcclComm::all_gather(const at::Tensor& in, at::Tensor& out) {
  check_tensor(in, "all_gather(in)");
  check_tensor(out, "all_gather(out)");
  if (out.numel() != world_ * in.numel() || in.scalar_type() != out.scalar_type())
    throw std::runtime_error(
        "parallel/nccl_comm: all_gather needs out.numel() == world * in.numel() and equal dtypes");
  count(out.numel() * out.element_size(), world_ > 1 ? double(world_ - 1) / world_ : 0.0);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  enqueue("all_gather (ncclAllGather)", [&] {
    return ncclAllGather(in.data_ptr(), out.data_ptr(), static_cast<size_t>(in.numel()),
                         nccl_type(in.scalar_type()), comm_, static_cast<cudaStream_t>(stream()));
  });
}

void NcclComm::broadcast(at::Tensor& t, int root) {
  check_tensor(t, "broadcast");
  count(t.numel() * t.element_size(), rank_ == root ? double(world_ - 1) : 0.0);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  enqueue("broadcast (ncclBroadcast)", [&] {
    return ncclBroadcast(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()),
                         nccl_type(t.scalar_type()), root, comm_, static_cast<cudaStream_t>(stream()));
  });
}

void NcclComm::barrier() {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  const CollectiveId id{"barrier (CUDA stream, then MPI_Ibarrier)", id_, ++seq_};
  // Wait for our stream by polling an event, under the deadline and watching NCCL's asynchronous errors.
  cudaEvent_t ev;
  check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  check_cuda(cudaEventRecord(ev, static_cast<cudaStream_t>(stream())), "cudaEventRecord");
  const double t0 = now_s(), timeout = collective_timeout();
  for (;;) {
    const cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) {
      cudaEventDestroy(ev);
      check_cuda(e, "cudaEventQuery (barrier)");
    }
    std::string problem;
    {
      std::lock_guard<std::mutex> lock(mu_);
      problem = check_locked(timeout);
    }
    if (problem.empty() && now_s() - t0 > timeout)
      problem = describe(id) + ": the CUDA stream did not drain within " + deadline_text();
    if (!problem.empty()) watchdog_fail(problem, &id);
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  cudaEventDestroy(ev);
  MPI_Request req;
  nccl_check_mpi(MPI_Ibarrier(mpi_, &req), describe(id));
  watchdog_wait_mpi(1, &req, id);
}

}  // namespace gmod

#endif  // GMOD_WITH_CUDA

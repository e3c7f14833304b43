#ifdef GMOD_WITH_CUDA

#include "parallel/nccl_comm.h"

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
    throw std::runtime_error(std::string("parallel/nccl_comm: ") + what + " failed: " + ncclGetErrorString(rc));
}

void check_mpi(int rc, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error("parallel/nccl_comm: " + what + " failed: " + std::string(msg, size_t(len)));
}

void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess)
    throw std::runtime_error(std::string("parallel/nccl_comm: ") + what + " failed: " + cudaGetErrorString(rc));
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
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kByte: return ncclUint8;
    case at::kChar: return ncclInt8;
    default:
      throw std::runtime_error(std::string("parallel/nccl_comm: unsupported dtype ") + c10::toString(t));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
  }
  return ncclSum;
}

}  // namespace

NcclComm::NcclComm(MPI_Comm parent, int device_index) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) throw std::runtime_error("parallel/nccl_comm: MPI is not initialised (call gmod::Runtime first)");
  check_mpi(MPI_Comm_dup(parent, &mpi_), "MPI_Comm_dup");
  check_mpi(MPI_Comm_set_errhandler(mpi_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  id_ = next_comm_id();
  check_mpi(MPI_Comm_rank(mpi_, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(mpi_, &world_), "MPI_Comm_size");
  MPI_Comm node;
  check_mpi(MPI_Comm_split_type(mpi_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  check_mpi(MPI_Comm_rank(node, &local_rank_), "MPI_Comm_rank(node)");
  check_mpi(MPI_Comm_free(&node), "MPI_Comm_free(node)");

  const int ndev = static_cast<int>(c10::cuda::device_count());
  if (ndev == 0) throw std::runtime_error("parallel/nccl_comm: no CUDA device visible on rank " + std::to_string(rank_));
  device_ = device_index >= 0 ? device_index : local_rank_ % ndev;
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_));

  ncclUniqueId uid;
  if (rank_ == 0) check_nccl(ncclGetUniqueId(&uid), "ncclGetUniqueId");
  const CollectiveId bcast{"bootstrap (MPI_Ibcast of the NCCL unique id)", id_, ++seq_};
  MPI_Request req;
  check_mpi(MPI_Ibcast(&uid, sizeof(uid), MPI_BYTE, 0, mpi_, &req), describe(bcast));
  watchdog_wait_mpi(1, &req, bcast);
  {
    WaitScope wait(CollectiveId{"bootstrap (ncclCommInitRank)", id_, ++seq_});
    check_nccl(ncclCommInitRank(&comm_, world_, uid, rank_), "ncclCommInitRank");
  }
  watchdog_register(this);
}

NcclComm::~NcclComm() {
  watchdog_unregister(this);
  for (auto& p : pending_) cudaEventDestroy(static_cast<cudaEvent_t>(p.event));
  if (comm_ && !aborted_) ncclCommDestroy(comm_);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && mpi_ != MPI_COMM_NULL) MPI_Comm_free(&mpi_);
}

void* NcclComm::stream() const {
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
}

void NcclComm::track(const char* what) {
  cudaEvent_t ev;
  check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  check_cuda(cudaEventRecord(ev, static_cast<cudaStream_t>(stream())), "cudaEventRecord");
  std::lock_guard<std::mutex> lock(mu_);
  // Drop what has completed, so the queue stays short even when no watchdog thread polls it.
  while (!pending_.empty() && cudaEventQuery(static_cast<cudaEvent_t>(pending_.front().event)) == cudaSuccess) {
    cudaEventDestroy(static_cast<cudaEvent_t>(pending_.front().event));
    pending_.pop_front();
  }
  pending_.push_back(Pending{ev, CollectiveId{what, id_, ++seq_}, watchdog_step(), now_s()});
}

std::string NcclComm::check_locked(double timeout_s) {
  if (aborted_) return "";
  ncclResult_t async = ncclSuccess;
  if (comm_ && ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess) {
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
    if (age > timeout_s)
      return describe(p.id) + " (enqueued at step " + std::to_string(p.step) + ") has not completed after " +
             secs(age) + " (parallel.timeout_s = " + secs(timeout_s) + ")";
  }
  return "";
}

std::string NcclComm::poll(double timeout_s) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  std::lock_guard<std::mutex> lock(mu_);
  return check_locked(timeout_s);
}

void NcclComm::abort() {
  // Not under mu_: a thread blocked inside NCCL must not keep the abort from happening.
  if (comm_ && !aborted_) {
    aborted_ = true;
    ncclCommAbort(comm_);
  }
}

void NcclComm::all_reduce(at::Tensor& t, ReduceOp op) {
  check_tensor(t, "all_reduce");
  count(t.numel() * t.element_size(), world_ > 1 ? 2.0 * (world_ - 1) / world_ : 0.0);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  check_nccl(ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t.scalar_type()),
                           nccl_op(op), comm_, static_cast<cudaStream_t>(stream())),
             "ncclAllReduce");
  track("all_reduce (ncclAllReduce)");
}

void NcclComm::reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) {
  check_tensor(in, "reduce_scatter(in)");
  check_tensor(out, "reduce_scatter(out)");
  if (in.numel() != world_ * out.numel() || in.scalar_type() != out.scalar_type())
    throw std::runtime_error("parallel/nccl_comm: reduce_scatter needs in.numel() == world * out.numel() and equal "
                             "dtypes");
  count(in.numel() * in.element_size(), world_ > 1 ? double(world_ - 1) / world_ : 0.0);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  check_nccl(ncclReduceScatter(in.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()),
                               nccl_type(in.scalar_type()), nccl_op(op), comm_, static_cast<cudaStream_t>(stream())),
             "ncclReduceScatter");
  track("reduce_scatter (ncclReduceScatter)");
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
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  int64_t off = 0;
  for (int k = 0; k < world_; ++k) {
    if (counts[k] > 0)
      check_nccl(ncclReduce(base + off * es, k == rank_ ? out.data_ptr() : nullptr, static_cast<size_t>(counts[k]),
                            nccl_type(in.scalar_type()), nccl_op(op), k, comm_, st),
                 "ncclReduce");
    off += counts[k];
  }
  check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  track("reduce_scatter_v_start (grouped ncclReduce)");
  return completed_request();  // stream-ordered: nothing left to wait for on the host
}

std::shared_ptr<Comm> NcclComm::duplicate() const { return std::make_shared<NcclComm>(mpi_, device_); }

void NcclComm::all_gather(const at::Tensor& in, at::Tensor& out) {
  check_tensor(in, "all_gather(in)");
  check_tensor(out, "all_gather(out)");
  if (out.numel() != world_ * in.numel() || in.scalar_type() != out.scalar_type())
    throw std::runtime_error("parallel/nccl_comm: all_gather needs out.numel() == world * in.numel() and equal dtypes");
  count(out.numel() * out.element_size(), world_ > 1 ? double(world_ - 1) / world_ : 0.0);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  check_nccl(ncclAllGather(in.data_ptr(), out.data_ptr(), static_cast<size_t>(in.numel()),
                           nccl_type(in.scalar_type()), comm_, static_cast<cudaStream_t>(stream())),
             "ncclAllGather");
  track("all_gather (ncclAllGather)");
}

void NcclComm::broadcast(at::Tensor& t, int root) {
  check_tensor(t, "broadcast");
  count(t.numel() * t.element_size(), rank_ == root ? double(world_ - 1) : 0.0);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  check_nccl(ncclBroadcast(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t.scalar_type()),
                           root, comm_, static_cast<cudaStream_t>(stream())),
             "ncclBroadcast");
  track("broadcast (ncclBroadcast)");
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
      problem = describe(id) + ": the CUDA stream did not drain within parallel.timeout_s = " + secs(timeout);
    if (!problem.empty()) watchdog_fail(problem, &id);
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  cudaEventDestroy(ev);
  MPI_Request req;
  check_mpi(MPI_Ibarrier(mpi_, &req), describe(id));
  watchdog_wait_mpi(1, &req, id);
}

}  // namespace gmod

#endif  // GMOD_WITH_CUDA

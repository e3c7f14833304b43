#ifdef GMOD_WITH_CUDA

#include "parallel/nccl_comm.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <stdexcept>
#include <string>

namespace gmod {
namespace {

void check_nccl(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess)
    throw std::runtime_error(std::string("parallel/nccl_comm: ") + what + " failed: " + ncclGetErrorString(rc));
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
  MPI_Comm_dup(parent, &mpi_);
  MPI_Comm_rank(mpi_, &rank_);
  MPI_Comm_size(mpi_, &world_);
  MPI_Comm node;
  MPI_Comm_split_type(mpi_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local_rank_);
  MPI_Comm_free(&node);

  const int ndev = static_cast<int>(c10::cuda::device_count());
  if (ndev == 0) throw std::runtime_error("parallel/nccl_comm: no CUDA device visible on rank " + std::to_string(rank_));
  device_ = device_index >= 0 ? device_index : local_rank_ % ndev;
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device_));

  ncclUniqueId id;
  if (rank_ == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi_);
  check_nccl(ncclCommInitRank(&comm_, world_, id, rank_), "ncclCommInitRank");
}

NcclComm::~NcclComm() {
  if (comm_) ncclCommDestroy(comm_);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && mpi_ != MPI_COMM_NULL) MPI_Comm_free(&mpi_);
}

void* NcclComm::stream() const {
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
}

void NcclComm::all_reduce(at::Tensor& t, ReduceOp op) {
  check_tensor(t, "all_reduce");
  count(t.numel() * t.element_size(), world_ > 1 ? 2.0 * (world_ - 1) / world_ : 0.0);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  check_nccl(ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t.scalar_type()),
                           nccl_op(op), comm_, static_cast<cudaStream_t>(stream())),
             "ncclAllReduce");
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
}

void NcclComm::broadcast(at::Tensor& t, int root) {
  check_tensor(t, "broadcast");
  count(t.numel() * t.element_size(), rank_ == root ? double(world_ - 1) : 0.0);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  check_nccl(ncclBroadcast(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t.scalar_type()),
                           root, comm_, static_cast<cudaStream_t>(stream())),
             "ncclBroadcast");
}

void NcclComm::barrier() {
  c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).synchronize();
  MPI_Barrier(mpi_);
}

}  // namespace gmod

#endif  // GMOD_WITH_CUDA

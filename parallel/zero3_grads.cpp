#include "parallel/zero3_grads.h"

#include <c10/core/GradMode.h>
#ifdef GMOD_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <optional>
#include <stdexcept>

namespace gmod {

struct Zero3Grads::CudaState {
#ifdef GMOD_WITH_CUDA
  explicit CudaState(c10::DeviceIndex d)
      : stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, d)), device(d) {}
  c10::cuda::CUDAStream stream;
  c10::DeviceIndex device;
#endif
};

Zero3Grads::Zero3Grads(Zero3Params& params, at::ScalarType reduce_dtype, std::shared_ptr<Comm> reduce_comm)
    : params_(params), reduce_dtype_(reduce_dtype), rcomm_(std::move(reduce_comm)) {
  if (!at::isFloatingType(reduce_dtype_))
    throw std::runtime_error("parallel/zero3_grads: reduce_dtype must be floating");
  const int n = params_.num_units();
  grad_.resize(size_t(n));
  members_.resize(size_t(n));
  const auto& e = params_.layout().entries();
  for (size_t i = 0; i < e.size(); ++i)
    for (int u = 0; u < n; ++u)
      if (e[i].offset >= params_.unit_range(u).first &&
          e[i].offset + e[i].numel <= params_.unit_range(u).second) {
        members_[size_t(u)].push_back(i);
        break;
      }
  gshard_ = at::zeros({params_.layout().shard_size()},
                      params_.params().front().second.options().dtype(at::kFloat).requires_grad(false));
#ifdef GMOD_WITH_CUDA
  if (gshard_.is_cuda()) cuda_ = std::make_unique<CudaState>(gshard_.device().index());
#endif
}

Zero3Grads::~Zero3Grads() {
  try {
    finish();
  } catch (...) {
  }
}

void Zero3Grads::attach(int u) {
  if (attached(u)) return;
  c10::NoGradGuard no_grad;
  const auto [lo, hi] = params_.unit_range(u);
  at::Tensor& g = grad_[size_t(u)];
  g = at::zeros({hi - lo}, params_.params().front().second.options().requires_grad(false));
  const auto& e = params_.layout().entries();
  for (size_t i : members_[size_t(u)]) {
    at::Tensor p = params_.params()[i].second;
    p.mutable_grad() = g.narrow(0, e[i].offset - lo, e[i].numel).view(e[i].shape);
  }
}

void Zero3Grads::reduce_start(int u) {
  attach(u);  // a unit none of whose parameters got a gradient still joins the collective (with zeros)
  c10::NoGradGuard no_grad;
  const auto [lo, hi] = params_.unit_range(u);
  Comm& comm = rcomm_ ? *rcomm_ : params_.comm();
  const int world = comm.world_size(), rank = comm.rank();
  const int64_t S = params_.layout().shard_size();
  std::vector<int64_t> counts(size_t(world), 0);
  for (int k = 0; k < world; ++k)
    counts[size_t(k)] = std::max<int64_t>(0, std::min(hi, (k + 1) * S) - std::max(lo, k * S));
  at::Tensor& g = grad_[size_t(u)];
#ifdef GMOD_WITH_CUDA
  std::optional<c10::cuda::CUDAStreamGuard> guard;
  if (cuda_) {
    // The reduction stream starts after everything the compute stream queued so far (this unit's backward).
    at::cuda::CUDAEvent ready;
    ready.record(c10::cuda::getCurrentCUDAStream(cuda_->device));
    ready.block(cuda_->stream);
    guard.emplace(cuda_->stream);
    c10::cuda::CUDACachingAllocator::recordStream(g.storage().data_ptr(), cuda_->stream);
  }
#endif
  at::Tensor red = g.scalar_type() == reduce_dtype_ ? g : g.to(reduce_dtype_);
  Inflight f;
  f.out = at::empty({counts[size_t(rank)]}, red.options());
  f.begin = std::max(lo, rank * S) - rank * S;
  f.req = comm.reduce_scatter_v_start(red, f.out, counts, ReduceOp::Avg);
  inflight_.push_back(std::move(f));
  for (size_t i : members_[size_t(u)]) params_.params()[i].second.mutable_grad() = at::Tensor();
  g = at::Tensor();  // the request holds what it reads until it completes
}

void Zero3Grads::retire_front() {
  Inflight f = std::move(inflight_.front());
  inflight_.pop_front();
#ifdef GMOD_WITH_CUDA
  std::optional<c10::cuda::CUDAStreamGuard> guard;
  if (cuda_) guard.emplace(cuda_->stream);  // the add below follows the reduction on its stream
#endif
  f.req->wait();
  c10::NoGradGuard no_grad;
  if (f.out.numel() > 0) gshard_.narrow(0, f.begin, f.out.numel()).add_(f.out);
}

void Zero3Grads::poll() {
  while (!inflight_.empty() && inflight_.front().req->test()) retire_front();
}

void Zero3Grads::progress() {
  for (auto& f : inflight_) f.req->test();
}

void Zero3Grads::finish() {
  while (!inflight_.empty()) retire_front();
#ifdef GMOD_WITH_CUDA
  if (cuda_) {  // consumers on the compute stream (norm, AdamW) start after the reductions
    at::cuda::CUDAEvent done;
    done.record(cuda_->stream);
    done.block(c10::cuda::getCurrentCUDAStream(cuda_->device));
  }
#endif
}

void Zero3Grads::limit_in_flight(size_t n) {
  while (inflight_.size() > n) retire_front();
}

void Zero3Grads::reduce(int u) {
  reduce_start(u);
  finish();
}

int64_t Zero3Grads::bytes_held() const {
  int64_t b = int64_t(gshard_.storage().nbytes());
  for (const auto& t : grad_)
    if (t.defined()) b += int64_t(t.storage().nbytes());
  return b;
}

}  // namespace gmod

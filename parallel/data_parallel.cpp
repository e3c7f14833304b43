#include "parallel/data_parallel.h"

#include "parallel/bucket_release.h"
#include "parallel/sharded_step.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#ifdef GMOD_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <stdexcept>

namespace gmod {
namespace {

std::string where(const std::string& name) { return "parallel/data_parallel: parameter '" + name + "'"; }

}  // namespace

// Installed as each parameter's post-accumulate-grad hook (runs on the autograd thread right after the gradient was
// accumulated into .grad).
class DpGradHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  DpGradHook(DataParallelOptimizer* opt, size_t index) : opt_(opt), index_(index) {}
  void operator()(const torch::autograd::Variable& param) override { opt_->on_grad_ready(index_, param); }

 private:
  DataParallelOptimizer* opt_;
  size_t index_;
};

struct DataParallelOptimizer::CudaState {
#ifdef GMOD_WITH_CUDA
  explicit CudaState(c10::DeviceIndex d) : stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, d)) {}
  c10::cuda::CUDAStream stream;
#endif
};

DataParallelOptimizer::DataParallelOptimizer(NamedParams params, std::shared_ptr<Comm> comm,
                                             DataParallelOptions opts)
    : params_(std::move(params)), comm_(std::move(comm)), opts_(opts) {
  if (!comm_) throw std::runtime_error("parallel/data_parallel: null Comm");
  if (opts_.stage < 0 || opts_.stage > 2)
    throw std::runtime_error("parallel/data_parallel: stage must be 0, 1 or 2, got " + std::to_string(opts_.stage));
  if (params_.empty()) throw std::runtime_error("parallel/data_parallel: no trainable parameters");
  if (!at::isFloatingType(opts_.reduce_dtype))
    throw std::runtime_error("parallel/data_parallel: reduce_dtype must be floating");
  if (!opts_.decay.empty() && opts_.decay.size() != params_.size())
    throw std::runtime_error("parallel/data_parallel: options.decay has " + std::to_string(opts_.decay.size()) +
                             " flags for " + std::to_string(params_.size()) + " parameters");
  const at::ScalarType dtype = params_.front().second.scalar_type();
  std::set<const void*> seen;
  for (const auto& [name, p] : params_) {
    if (!p.defined()) throw std::runtime_error(where(name) + " is undefined");
    if (!p.requires_grad()) throw std::runtime_error(where(name) + " does not require grad (pass only trainable ones)");
    if (!at::isFloatingType(p.scalar_type()) || p.scalar_type() != dtype)
      throw std::runtime_error(where(name) + " has dtype " + std::string(c10::toString(p.scalar_type())) +
                               ", expected " + c10::toString(dtype) + " like the first parameter");
    if (p.device() != comm_->device())
      throw std::runtime_error(where(name) + " is on " + p.device().str() + " but the communicator moves " +
                               comm_->device().str() + " tensors");
    if (!seen.insert(p.unsafeGetTensorImpl()).second)
      throw std::runtime_error(where(name) + " is the same tensor as an earlier one (tied weights: pass it once)");
  }

  c10::NoGradGuard no_grad;
  const int world = comm_->world_size(), rank = comm_->rank();
  layout_ = FlatParamLayout::from_params(params_, world);
  const auto opt = params_.front().second.options().requires_grad(false);
  pflat_ = at::zeros({layout_.padded_total()}, opt);
  for (size_t i = 0; i < params_.size(); ++i) {
    const FlatParamEntry& e = layout_.entries()[i];
    at::Tensor& p = params_[i].second;
    at::Tensor view = pflat_.narrow(0, e.offset, e.numel).view(e.shape);
    view.copy_(p.detach());
    p.set_data(view);
  }

  // Buckets of whole parameters, last parameter first; bucket 0 also holds the tail padding.
  const int64_t bucket = std::max<int64_t>(1, opts_.bucket_bytes / c10::elementSize(opts_.reduce_dtype));
  bucket_of_.assign(params_.size(), 0);
  int64_t hi = layout_.padded_total();
  std::vector<size_t> members;
  for (size_t k = params_.size(); k-- > 0;) {
    const int64_t lo = layout_.entries()[k].offset;
    bucket_of_[k] = static_cast<int>(bucket_ranges_.size());
    members.push_back(k);
    if (hi - lo >= bucket || k == 0) {
      bucket_ranges_.push_back({k == 0 ? 0 : lo, hi});
      bucket_members_.push_back(std::move(members));
      members.clear();
      hi = lo;
    }
  }

  // Gradient storage: stage 0/1 one flat buffer (the reduced vector is read across buckets), stage 2 one
  // allocation per bucket so that each can be released after its reduce-scatter.
  acc32_ = opts_.accumulate_fp32 && dtype != at::kFloat;
  const int nb = static_cast<int>(bucket_ranges_.size());
  bucket_grad_.resize(nb);
  bucket_acc_.resize(nb);
  if (opts_.stage < 2) {
    gflat_ = at::zeros({layout_.padded_total()}, opt);
    if (acc32_) gacc_ = at::zeros({layout_.padded_total()}, opt.dtype(at::kFloat));
    for (int b = 0; b < nb; ++b) {
      const auto [lo, hi2] = bucket_ranges_[b];
      bucket_grad_[b] = gflat_.narrow(0, lo, hi2 - lo);
      if (acc32_) bucket_acc_[b] = gacc_.narrow(0, lo, hi2 - lo);
    }
  }
  attach_grads();  // keeps any existing .grad values (stage 2: allocates only the buckets that have one)

  int64_t begin = 0, end = layout_.total();
  if (opts_.stage > 0) std::tie(begin, end) = layout_.shard_range(rank);
  gshard_is_view_ = opts_.stage < 2 && (acc32_ || dtype == at::kFloat) && opts_.reduce_dtype == at::kFloat;
  gshard_ = gshard_is_view_ ? (acc32_ ? gacc_ : gflat_).narrow(0, begin, end - begin)
                            : at::zeros({end - begin}, opt.dtype(at::kFloat));
  AdamWHyper hyper{opts_.beta1, opts_.beta2, opts_.eps, opts_.weight_decay, opts_.offload};
  adam_ = std::make_unique<ShardedAdamW>(begin, end, pflat_.narrow(0, begin, end - begin), hyper);
  if (!opts_.decay.empty()) adam_->set_decay_ranges(decay_ranges(layout_, opts_.decay));
  set_param_groups(*adam_, layout_, opts_.group, opts_.group_weight_decay, opts_.weight_decay,
                   "parallel/data_parallel: options.group");

  reset_readiness();
  gcomm_ = opts_.overlap_comm ? comm_->duplicate() : comm_;
#ifdef GMOD_WITH_CUDA
  if (opts_.overlap_comm && comm_->device().is_cuda()) cuda_ = std::make_unique<CudaState>(comm_->device().index());
#endif
  // Stage 2 needs the hooks to re-attach gradients written into released buckets.
  if (opts_.overlap_comm || acc32_ || opts_.stage == 2) install_hooks();
}

DataParallelOptimizer::~DataParallelOptimizer() {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    remove_hooks();
    for (auto& f : inflight_) f.req->wait();
#ifdef GMOD_WITH_CUDA
    if (cuda_) cuda_->stream.synchronize();
#endif
  } catch (...) {
  }
}

void DataParallelOptimizer::install_hooks() {
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i].second;
    if (torch::autograd::impl::post_acc_grad_hooks(p))
      throw std::runtime_error(where(params_[i].first) + " already has a post-accumulate-grad hook");
    torch::autograd::impl::set_post_acc_grad_hooks(p, std::make_unique<DpGradHook>(this, i));
  }
  hooks_installed_ = true;
}

void DataParallelOptimizer::remove_hooks() {
  if (!hooks_installed_) return;
  for (auto& [name, p] : params_) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
  hooks_installed_ = false;
}

void DataParallelOptimizer::reset_readiness() {
  pending_.clear();
  for (const auto& m : bucket_members_) pending_.push_back(static_cast<int>(m.size()));
  ready_.assign(params_.size(), 0);
  next_launch_ = 0;
}

at::Tensor DataParallelOptimizer::grad_view(size_t index) const {
  const FlatParamEntry& e = layout_.entries()[index];
  const int b = bucket_of_[index];
  return bucket_grad_[b].narrow(0, e.offset - bucket_ranges_[b].first, e.numel);
}

at::Tensor DataParallelOptimizer::acc_view(size_t index) const {
  const FlatParamEntry& e = layout_.entries()[index];
  const int b = bucket_of_[index];
  return bucket_acc_[b].narrow(0, e.offset - bucket_ranges_[b].first, e.numel);
}

void DataParallelOptimizer::ensure_bucket(int b) {
  if (bucket_grad_[b].defined()) return;
  const auto [lo, hi] = bucket_ranges_[b];
  const auto opt = pflat_.options();
  bucket_grad_[b] = at::zeros({hi - lo}, opt);
  if (acc32_) bucket_acc_[b] = at::zeros({hi - lo}, opt.dtype(at::kFloat));
}

void DataParallelOptimizer::release_bucket(int b) {
  if (opts_.stage != 2) return;
  for (size_t i : bucket_members_[b]) params_[i].second.mutable_grad() = at::Tensor();
  bucket_grad_[b] = at::Tensor();
  bucket_acc_[b] = at::Tensor();
}

void DataParallelOptimizer::set_last_micro_batch(bool last) {
  armed_ = last && opts_.overlap_comm;
  if (armed_) launched_early_ = 0;
}

void DataParallelOptimizer::on_grad_ready(size_t index, const at::Tensor& param) {
  c10::NoGradGuard no_grad;
  std::lock_guard<std::mutex> lock(mu_);
  const FlatParamEntry& e = layout_.entries()[index];
  ensure_bucket(bucket_of_[index]);  // stage 2: first gradient since the bucket was released
  at::Tensor view = grad_view(index);
  const at::Tensor& g = param.grad();
  const bool ours = g.defined() && g.data_ptr() == view.data_ptr();
  if (acc32_) {
    // Fold this micro-batch's low-precision gradient into fp32 and start the param's grad from zero again.
    acc_view(index).add_(g.defined() ? g.reshape({-1}) : view);
    view.zero_();
  } else if (!ours && g.defined()) {
    view.copy_(g.reshape({-1}));  // autograd created a fresh .grad (released bucket, or the grad was replaced)
  }
  if (!ours) param.mutable_grad() = view.view(e.shape);
  if (!armed_) return;
  if (ready_[index])
    throw std::runtime_error(where(params_[index].first) + " received a second gradient in the same backward "
                             "(reentrant checkpointing?): its bucket may already be reduced; set overlap_comm = false");
  ready_[index] = 1;
  --pending_[bucket_of_[index]];
  const int nb = static_cast<int>(bucket_ranges_.size());
  while (next_launch_ < nb && pending_[next_launch_] == 0) {
    launch(next_launch_++, false);
    ++launched_early_;
  }
  // MPI progresses only inside MPI calls. Completed buckets are retired (stage 2 on MPI: released) in step(), so that
  // what a backward holds does not depend on how fast the network is (CUDA: released by launch(), when enqueued).
  for (auto& f : inflight_) f.req->test();
}

void DataParallelOptimizer::launch(int b, bool flush) {
  const auto [lo, hi] = bucket_ranges_[b];
  ensure_bucket(b);       // stage 2: a bucket none of whose parameters got a gradient
  if (flush && acc32_) {  // gradients written outside the hooks (a replaced or edited .grad)
    bucket_acc_[b].add_(bucket_grad_[b]);
    bucket_grad_[b].zero_();
  }
  const at::Tensor& src = acc32_ ? bucket_acc_[b] : bucket_grad_[b];
#ifdef GMOD_WITH_CUDA
  std::optional<c10::cuda::CUDAStreamGuard> guard;
  if (cuda_) {
    // The comm stream starts after everything the compute stream has queued so far (this bucket's gradients).
    at::cuda::CUDAEvent ready;
    ready.record(c10::cuda::getCurrentCUDAStream(comm_->device().index()));
    ready.block(cuda_->stream);
    guard.emplace(cuda_->stream);
    c10::cuda::CUDACachingAllocator::recordStream(src.storage().data_ptr(), cuda_->stream);
    c10::cuda::CUDACachingAllocator::recordStream(gshard_.storage().data_ptr(), cuda_->stream);
  }
#endif
  const int64_t chunk = std::max<int64_t>(1, opts_.bucket_bytes / c10::elementSize(opts_.reduce_dtype));
  const int world = comm_->world_size(), rank = comm_->rank();
  const int64_t s = layout_.shard_size();
  const int64_t rb = adam_->begin();
  for (int64_t c0 = lo; c0 < hi; c0 += chunk) {
    const int64_t len = std::min(chunk, hi - c0);
    at::Tensor g = src.narrow(0, c0 - lo, len);
    at::Tensor red = g.scalar_type() == opts_.reduce_dtype ? g : g.to(opts_.reduce_dtype);
    Inflight f;
    f.bucket = b;
    f.last = c0 + len >= hi;
    if (opts_.stage < 2) {
      f.req = gcomm_->all_reduce_start(red, ReduceOp::Avg);
      f.red = red;
      f.begin = c0;
    } else {
      // Owner k receives the part of [c0, c0+len) inside its shard [k*s, (k+1)*s).
      std::vector<int64_t> counts(world, 0);
      for (int k = 0; k < world; ++k)
        counts[k] = std::max<int64_t>(0, std::min(c0 + len, (k + 1) * s) - std::max(c0, k * s));
      f.begin = std::max(c0, rank * s);
      f.direct = red.scalar_type() == at::kFloat && counts[rank] > 0;
      f.out = f.direct ? gshard_.narrow(0, f.begin - rb, counts[rank]) : at::empty({counts[rank]}, red.options());
      f.req = gcomm_->reduce_scatter_v_start(red, f.out, counts, ReduceOp::Avg);
    }
    inflight_.push_back(std::move(f));
  }
  // Stream-ordered backends (CUDA): the collectives are enqueued and the storage is recorded on their stream, so
  // the bucket's gradient can go now instead of living until step() (parallel/bucket_release.h).
  if (release_bucket_at_launch(opts_.stage, comm_->device())) release_bucket(b);
}

void DataParallelOptimizer::retire_front() {
  Inflight f = std::move(inflight_.front());
  inflight_.pop_front();
#ifdef GMOD_WITH_CUDA
  std::optional<c10::cuda::CUDAStreamGuard> guard;
  if (cuda_) guard.emplace(cuda_->stream);  // the copy below follows the collective on the comm stream
#endif
  f.req->wait();
  const int64_t rb = adam_->begin(), re = adam_->end();
  if (f.out.defined()) {
    if (!f.direct && f.out.numel() > 0) gshard_.narrow(0, f.begin - rb, f.out.numel()).copy_(f.out);
  } else if (!gshard_is_view_) {
    const int64_t lo = std::max(f.begin, rb), hi = std::min(f.begin + f.red.numel(), re);
    if (lo < hi) gshard_.narrow(0, lo - rb, hi - lo).copy_(f.red.narrow(0, lo - f.begin, hi - lo));
  }
  if (f.last) release_bucket(f.bucket);  // stage 2: its owned part is in gshard_ now
}

void DataParallelOptimizer::finish_all() {
  const int nb = static_cast<int>(bucket_ranges_.size());
#ifdef GMOD_WITH_CUDA
  std::optional<c10::cuda::CUDAStream> compute;
  if (cuda_) compute = c10::cuda::getCurrentCUDAStream(comm_->device().index());
#endif
  // Launch the rest in bucket order, keeping few chunks in flight so that their reduce_dtype copies (and, at stage 2,
  // the buckets themselves) are released as we go.
  while (next_launch_ < nb) {
    launch(next_launch_++, true);
    while (inflight_.size() > kMaxInflight) retire_front();
  }
  while (!inflight_.empty()) retire_front();
#ifdef GMOD_WITH_CUDA
  if (cuda_) {  // consumers on the compute stream (norm, AdamW, zero_grad) start after the reductions
    at::cuda::CUDAEvent done;
    done.record(cuda_->stream);
    done.block(*compute);
  }
#endif
  reset_readiness();
}

void DataParallelOptimizer::attach_grads() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (bucket_of_[i] < next_launch_) continue;  // already launched by the hooks (stage 2: maybe released)
    const FlatParamEntry& e = layout_.entries()[i];
    at::Tensor& p = params_[i].second;
    // Stage 2: a bucket stays unallocated until a gradient needs it (launch() allocates zeros to reduce).
    if (!bucket_grad_[bucket_of_[i]].defined() && !p.grad().defined()) continue;
    ensure_bucket(bucket_of_[i]);
    at::Tensor view = grad_view(i).view(e.shape);
    const at::Tensor& g = p.grad();
    if (g.defined() && g.data_ptr() == view.data_ptr() && g.sizes() == view.sizes() && g.strides() == view.strides())
      continue;
    if (g.defined())
      view.copy_(g);  // someone replaced the grad (e.g. zero_grad(set_to_none) + backward): take its values
    else
      view.zero_();
    p.mutable_grad() = view;
  }
}

void DataParallelOptimizer::zero_grad() {
  c10::NoGradGuard no_grad;
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = false;
  if (!inflight_.empty() || next_launch_ > 0) finish_all();  // an armed backward without step(): drain it
  if (opts_.stage < 2) {
    gflat_.zero_();
    if (gacc_.defined()) gacc_.zero_();
    attach_grads();
  } else {
    // Released buckets stay released (their parameters' .grad undefined, i.e. zero) until backward writes.
    for (size_t b = 0; b < bucket_grad_.size(); ++b) {
      if (!bucket_grad_[b].defined()) {
        for (size_t i : bucket_members_[b]) params_[i].second.mutable_grad() = at::Tensor();
        continue;
      }
      bucket_grad_[b].zero_();
      if (bucket_acc_[b].defined()) bucket_acc_[b].zero_();
      for (size_t i : bucket_members_[b]) {
        at::Tensor& p = params_[i].second;
        at::Tensor view = grad_view(i).view(layout_.entries()[i].shape);
        if (!p.grad().defined() || p.grad().data_ptr() != view.data_ptr()) p.mutable_grad() = view;
      }
    }
  }
  reduced_ = false;
}

void DataParallelOptimizer::reduce_gradients() {
  c10::NoGradGuard no_grad;
  std::lock_guard<std::mutex> lock(mu_);
  armed_ = false;
  attach_grads();
  finish_all();
  reduced_ = true;
}

void DataParallelOptimizer::all_reduce_after_gradients(at::Tensor& t, ReduceOp op) {
  if (!reduced_) reduce_gradients();  // drain first: nothing of this window is in flight on grad_comm() after it
  comm_->all_reduce(t, op);
}

size_t DataParallelOptimizer::reductions_in_flight() {
  std::lock_guard<std::mutex> lock(mu_);
  return inflight_.size();
}

StepResult DataParallelOptimizer::step(const std::vector<double>& lrs) {
  if (!reduced_) reduce_gradients();
  reduced_ = false;
  // Stage 0 ranks all hold the same full gradient: nothing to sum.
  const StepResult res = clip_and_step(*adam_, gshard_, opts_.stage > 0 ? comm_.get() : nullptr, opts_.max_grad_norm, lrs);
  if (res.skipped) {
    ++skipped_;
    return res;
  }
  write_params();
  return res;
}

void DataParallelOptimizer::write_params() {
  c10::NoGradGuard no_grad;
  const int64_t rb = adam_->begin(), re = adam_->end();
  adam_->copy_master_to(pflat_.narrow(0, rb, re - rb));  // offloaded: host -> device
  if (opts_.stage > 0) {
    at::Tensor mine = pflat_.narrow(0, rb, re - rb);
    comm_->all_gather(mine, pflat_);
  }
}

void DataParallelOptimizer::broadcast_params(int root) {
  c10::NoGradGuard no_grad;
  comm_->broadcast(pflat_, root);
  adam_->reset_master(pflat_.narrow(0, adam_->begin(), adam_->end() - adam_->begin()));
}

DpMemory DataParallelOptimizer::memory_plan(int64_t num_params, int world, at::ScalarType param_dtype,
                                            const DataParallelOptions& o, bool at_step) {
  if (world < 1 || num_params < 0) throw std::runtime_error("parallel/data_parallel: memory_plan needs world >= 1");
  const int64_t padded = (num_params + world - 1) / world * world, shard = padded / world;
  const int64_t owned = o.stage == 0 ? num_params : shard;
  const bool acc32 = o.accumulate_fp32 && param_dtype != at::kFloat;
  const bool released = o.stage == 2 && at_step;
  const bool alias = o.stage < 2 && (acc32 || param_dtype == at::kFloat) && o.reduce_dtype == at::kFloat;
  DpMemory m;
  m.grad_buffer = released ? 0 : padded * int64_t(c10::elementSize(param_dtype));
  m.fp32_accum = acc32 && !released ? 4 * padded : 0;
  m.reduced_grad = alias ? 0 : 4 * owned;
  (o.offload ? m.host_state : m.optimizer_state) = 12 * owned;
  return m;
}

DpMemory DataParallelOptimizer::memory_held() const {
  std::set<const void*> seen;
  auto bytes = [&seen](const at::Tensor& t) -> int64_t {
    if (!t.defined() || !t.has_storage()) return 0;
    const void* key = t.storage().unsafeGetStorageImpl();
    return seen.insert(key).second ? int64_t(t.storage().nbytes()) : 0;
  };
  DpMemory m;
  const int64_t state = bytes(adam_->master()) + bytes(adam_->exp_avg()) + bytes(adam_->exp_avg_sq());
  if (adam_->offloaded())
    m.host_state = adam_->host_bytes();
  else
    m.optimizer_state = state;
  seen.insert(pflat_.storage().unsafeGetStorageImpl());  // compute params are not the optimizer's
  for (const auto& t : bucket_grad_) m.grad_buffer += bytes(t);
  for (const auto& t : bucket_acc_) m.fp32_accum += bytes(t);
  m.reduced_grad = bytes(gshard_);  // 0 when it is a view of a buffer counted above
  return m;
}

AdamWShardState DataParallelOptimizer::state_dict() const {
  return shard_state(*adam_, layout_, opts_.stage, comm_->rank());
}

void DataParallelOptimizer::load_state_dict(const AdamWShardState& state) {
  load_shard_state(*adam_, layout_, state, "parallel/data_parallel");
  write_params();
}

}  // namespace gmod

#include "parallel/data_parallel.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>

namespace gmod {
namespace {

std::string where(const std::string& name) { return "parallel/data_parallel: parameter '" + name + "'"; }

}  // namespace

DataParallelOptimizer::DataParallelOptimizer(NamedParams params, std::shared_ptr<Comm> comm,
                                             DataParallelOptions opts)
    : params_(std::move(params)), comm_(std::move(comm)), opts_(opts) {
  if (!comm_) throw std::runtime_error("parallel/data_parallel: null Comm");
  if (opts_.stage < 0 || opts_.stage > 2)
    throw std::runtime_error("parallel/data_parallel: stage must be 0, 1 or 2, got " + std::to_string(opts_.stage));
  if (params_.empty()) throw std::runtime_error("parallel/data_parallel: no trainable parameters");
  if (!at::isFloatingType(opts_.reduce_dtype))
    throw std::runtime_error("parallel/data_parallel: reduce_dtype must be floating");
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
  gflat_ = at::zeros({layout_.padded_total()}, opt);
  for (size_t i = 0; i < params_.size(); ++i) {
    const FlatParamEntry& e = layout_.entries()[i];
    at::Tensor& p = params_[i].second;
    at::Tensor view = pflat_.narrow(0, e.offset, e.numel).view(e.shape);
    view.copy_(p.detach());
    p.set_data(view);
  }
  attach_grads();

  int64_t begin = 0, end = layout_.total();
  if (opts_.stage > 0) std::tie(begin, end) = layout_.shard_range(rank);
  gshard_is_view_ = opts_.stage < 2 && dtype == at::kFloat && opts_.reduce_dtype == at::kFloat;
  gshard_ = gshard_is_view_ ? gflat_.narrow(0, begin, end - begin)
                            : at::zeros({end - begin}, opt.dtype(at::kFloat));
  AdamWHyper hyper{opts_.beta1, opts_.beta2, opts_.eps, opts_.weight_decay};
  adam_ = std::make_unique<ShardedAdamW>(begin, end, pflat_.narrow(0, begin, end - begin), hyper);
}

void DataParallelOptimizer::attach_grads() {
  for (size_t i = 0; i < params_.size(); ++i) {
    const FlatParamEntry& e = layout_.entries()[i];
    at::Tensor& p = params_[i].second;
    at::Tensor view = gflat_.narrow(0, e.offset, e.numel).view(e.shape);
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
  gflat_.zero_();
  attach_grads();
  reduced_ = false;
}

void DataParallelOptimizer::reduce_gradients() {
  c10::NoGradGuard no_grad;
  attach_grads();
  if (opts_.stage == 2)
    reduce_scatter();
  else
    reduce_all();
  reduced_ = true;
}

void DataParallelOptimizer::reduce_all() {
  const int64_t es = c10::elementSize(opts_.reduce_dtype);
  const int64_t bucket = std::max<int64_t>(1, opts_.bucket_bytes / es);
  const int64_t padded = layout_.padded_total();
  const int64_t rb = adam_->begin(), re = adam_->end();
  for (int64_t b0 = 0; b0 < padded; b0 += bucket) {
    const int64_t len = std::min(bucket, padded - b0);
    at::Tensor g = gflat_.narrow(0, b0, len);
    at::Tensor red = g.scalar_type() == opts_.reduce_dtype ? g : g.to(opts_.reduce_dtype);
    comm_->all_reduce(red, ReduceOp::Avg);
    if (gshard_is_view_) continue;  // reduced in place inside gflat_
    const int64_t lo = std::max(b0, rb), hi = std::min(b0 + len, re);
    if (lo < hi) gshard_.narrow(0, lo - rb, hi - lo).copy_(red.narrow(0, lo - b0, hi - lo));
  }
}

void DataParallelOptimizer::reduce_scatter() {
  // Bucket c covers columns [c0, c0+len) of every rank's shard, so each bucket splits evenly across ranks:
  // in = [world, len] (rank k's block = its shard's columns), out = our shard's columns.
  const int world = comm_->world_size();
  const int64_t es = c10::elementSize(opts_.reduce_dtype);
  const int64_t cols = std::max<int64_t>(1, opts_.bucket_bytes / es / world);
  const int64_t s = layout_.shard_size();
  at::Tensor blocks = gflat_.view({world, s});
  for (int64_t c0 = 0; c0 < s; c0 += cols) {
    const int64_t len = std::min(cols, s - c0);
    at::Tensor in = blocks.narrow(1, c0, len).to(opts_.reduce_dtype).contiguous().view({-1});
    at::Tensor out = gshard_.narrow(0, c0, len);
    if (opts_.reduce_dtype == at::kFloat) {
      comm_->reduce_scatter(in, out, ReduceOp::Avg);
    } else {
      at::Tensor tmp = at::empty({len}, in.options());
      comm_->reduce_scatter(in, tmp, ReduceOp::Avg);
      out.copy_(tmp);
    }
  }
}

StepResult DataParallelOptimizer::step(double lr) {
  if (!reduced_) reduce_gradients();
  reduced_ = false;
  c10::NoGradGuard no_grad;
  StepResult res;
  // [sum of squares, non-finite flag] of our part of the averaged gradient; summed over ranks for stage 1/2
  // (stage 0 ranks all hold the same full gradient). Padding is zero and adds nothing.
  at::Tensor norm = at::linalg_vector_norm(gshard_, 2).to(at::kDouble);
  at::Tensor t = at::stack({norm * norm, at::logical_not(at::isfinite(norm)).to(at::kDouble)});
  if (opts_.stage > 0) comm_->all_reduce(t, ReduceOp::Sum);
  t = t.cpu();
  const double sq = t[0].item<double>();
  const bool bad = t[1].item<double>() > 0 || !std::isfinite(sq);
  res.grad_norm = std::sqrt(sq);
  if (bad) {
    res.skipped = true;
    ++skipped_;
    return res;
  }
  if (opts_.max_grad_norm > 0) {
    const double coef = opts_.max_grad_norm / (res.grad_norm + 1e-6);
    if (coef < 1.0) {
      gshard_.mul_(coef);
      res.clipped = true;
    }
  }
  adam_->step(gshard_, lr);
  write_params();
  return res;
}

void DataParallelOptimizer::write_params() {
  c10::NoGradGuard no_grad;
  const int64_t rb = adam_->begin(), re = adam_->end();
  pflat_.narrow(0, rb, re - rb).copy_(adam_->master());
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

AdamWShardState DataParallelOptimizer::state_dict() const {
  AdamWShardState s;
  s.layout = layout_;
  s.stage = opts_.stage;
  s.rank = comm_->rank();
  s.begin = adam_->begin();
  s.end = adam_->end();
  s.step = adam_->step_count();
  s.master = adam_->master();
  s.exp_avg = adam_->exp_avg();
  s.exp_avg_sq = adam_->exp_avg_sq();
  return s;
}

void DataParallelOptimizer::load_state_dict(const AdamWShardState& state) {
  if (!state.layout.same_params(layout_))
    throw std::runtime_error("parallel/data_parallel: optimizer state was saved for different parameters (names, "
                             "shapes or order differ)");
  adam_->load(state);
  write_params();
}

}  // namespace gmod

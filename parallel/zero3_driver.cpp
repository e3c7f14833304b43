#include "parallel/zero3_driver.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <map>
#include <stdexcept>


namespace gmod {

// Each trainable parameter's post-accumulate-grad hook (runs right after autograd accumulated its gradient).
class Zero3GradHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  Zero3GradHook(Zero3Driver* d, size_t index) : d_(d), index_(index) {}
  void operator()(const torch::autograd::Variable&) override { d_->on_grad_ready(index_); }

 private:
  Zero3Driver* d_;
  size_t index_;
};

Zero3Driver::Zero3Driver(Units mods, NamedParams trainable, std::shared_ptr<Comm> comm,
                         const DataParallelOptions& opts, int prefetch, bool reshard_after_forward)
    : comm_(std::move(comm)), prefetch_(prefetch), reshard_(reshard_after_forward), offload_(opts.offload) {
  if (!comm_) throw std::runtime_error("parallel/zero3_driver: null Comm");
  if (prefetch_ < 0) throw std::invalid_argument("optimizer.zero3_prefetch must be >= 0");
  if (trainable.empty()) throw std::runtime_error("parallel/zero3_driver: no trainable parameters");
  {
    c10::NoGradGuard no_grad;  // every rank starts from rank 0's values, as ZeRO-1/2's broadcast_params
    for (auto& [name, p] : trainable) {
      at::Tensor d = p.detach();
      comm_->broadcast(d, 0);
    }
  }
  // Owner (position among the hooked modules) of every trainable parameter; -1: persistent.
  std::map<const void*, int> owner;
  for (size_t k = 0; k < mods.size(); ++k)
    for (const auto& p : mods[k]->parameters()) owner[p.unsafeGetTensorImpl()] = static_cast<int>(k);
  std::vector<int> unit, unit_owner;
  for (size_t i = 0; i < trainable.size(); ++i) {
    const auto it = owner.find(trainable[i].second.unsafeGetTensorImpl());
    const int o = it == owner.end() ? -1 : it->second;
    if (i == 0 || o != unit_owner.back()) {
      if (o >= 0)
        for (int seen : unit_owner)
          if (seen == o)
            throw std::runtime_error(
                "parallel/zero3_driver: the trainable parameters of one unit are not consecutive "
                "in the model's parameter order (at '" +
                trainable[i].first + "')");
      unit_owner.push_back(o);
    }
    unit.push_back(static_cast<int>(unit_owner.size()) - 1);
  }
  unit_of_param_ = unit;
  const int n = static_cast<int>(unit_owner.size());
  pos_.assign(size_t(n), -1);
  std::vector<int> unit_of_module(mods.size(), -1);
  for (int u = 0; u < n; ++u) {
    if (unit_owner[size_t(u)] < 0)
      persistent_.push_back(u);
    else
      unit_of_module[size_t(unit_owner[size_t(u)])] = u;
  }
  for (size_t k = 0; k < mods.size(); ++k) {
    const int u = unit_of_module[k];
    if (u < 0) continue;  // frozen unit: not sharded, nothing to do
    pos_[size_t(u)] = static_cast<int>(order_.size());
    order_.push_back(u);
    module_unit_.emplace_back(mods[k].get(), u);
  }
  red_order_.assign(order_.rbegin(), order_.rend());
  red_order_.insert(red_order_.end(), persistent_.rbegin(), persistent_.rend());
  members_.assign(size_t(n), 0);
  for (int u : unit) ++members_[size_t(u)];

  params_ = std::make_unique<Zero3Params>(std::move(trainable), unit, comm_);
  // MPI: the reductions on their own communicator (progress of one never waits for the other's); CUDA: on
  // comm_ too (two NCCL communicators must not run at once), on Zero3Grads' reduction stream.
  grads_ = std::make_unique<Zero3Grads>(*params_, opts.reduce_dtype,
                                        comm_->device().is_cuda() ? nullptr : comm_->duplicate());
  opt_ = std::make_unique<Zero3Optimizer>(*params_, *grads_,
                                          AdamWHyper{opts.beta1, opts.beta2, opts.eps, opts.weight_decay, opts.offload},
                                          opts.max_grad_norm, opts.decay, opts.group, opts.group_weight_decay);
  for (int u = 0; u < n; ++u) params_->release(u);
  // (One rank: a reduction is complete when started and pre_backward's poll retires it at once, as on CUDA.)
  mpi_collect_ = !comm_->device().is_cuda() && comm_->world_size() > 1;
  ran_.assign(size_t(n), 0);
  reduce_started_.assign(size_t(n), 0);
  pending_ = members_;
  const auto& ps = params_->params();
  for (size_t i = 0; i < ps.size(); ++i) {
    if (torch::autograd::impl::post_acc_grad_hooks(ps[i].second))
      throw std::runtime_error("parallel/zero3_driver: parameter '" + ps[i].first +
                               "' already has a post-accumulate-grad hook");
    torch::autograd::impl::set_post_acc_grad_hooks(ps[i].second, std::make_unique<Zero3GradHook>(this, i));
  }
  set_unit_hooks(this);
}

Zero3Driver::~Zero3Driver() {
  if (unit_hooks() == this) set_unit_hooks(nullptr);
  try {
    for (const auto& [name, p] : params_->params())
      torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
  } catch (...) {
  }
}

int Zero3Driver::unit_of(const torch::nn::Module& m) const {
  for (const auto& [mod, u] : module_unit_)
    if (mod == &m) return u;
  return -1;
}

void Zero3Driver::begin_forward() {
  std::lock_guard<std::mutex> lock(mu_);
  if (suspended_)
    throw std::logic_error("parallel/zero3_driver: training forward between gather_all and release_all");
  for (int u : persistent_) params_->gather_start(u);
  for (int u : persistent_) params_->wait(u);
  fcur_ = 0;
}

void Zero3Driver::pre_forward(const torch::nn::Module& m) {
  std::lock_guard<std::mutex> lock(mu_);
  if (suspended_) return;
  const int u = unit_of(m);
  if (u < 0) return;
  const int k = pos_[size_t(u)];
  if (k < fcur_ && !params_->gathered(u))  // (a gathered one was prefetched)
    throw std::logic_error("parallel/zero3_driver: unit " + std::to_string(u) +
                           " runs after a later unit of the forward order, or twice in one forward");
  const int n = static_cast<int>(order_.size());
  for (; fcur_ < n && fcur_ <= k + prefetch_; ++fcur_) {
    const int v = order_[size_t(fcur_)];
    params_->gather_start(v);
    if (fcur_ < k)
      params_->release(v);  // a unit this rank's forward does not run (no image): gathered for the others
  }
  params_->wait(u);  // the next units' gathers stay in flight while this one runs
}

at::Tensor Zero3Driver::post_forward(const torch::nn::Module& m, const at::Tensor& out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (suspended_) return out;
  const int u = unit_of(m);
  if (u < 0) return out;
  if (c10::GradMode::is_enabled() && out.requires_grad()) {
    ran_[size_t(u)] = 1;
    at::Tensor o = out;
    o.register_hook([this, u](const at::Tensor&) { pre_backward(u); });
    if (!reshard_) return out;  // kept gathered until its backward is over
  }
  params_->release(u);  // reshard after forward; the backward gathers it again
  params_->progress();
  return out;
}

void Zero3Driver::end_forward() {
  std::lock_guard<std::mutex> lock(mu_);
  const int n = static_cast<int>(order_.size());
  for (; fcur_ < n; ++fcur_) {
    params_->gather(order_[size_t(fcur_)]);
    params_->release(order_[size_t(fcur_)]);
  }
  for (int u : order_)
    if (reshard_ || !ran_[size_t(u)]) params_->release(u);  // prefetched and not run
  for (int u : persistent_) grads_->attach(u);
  bcur_ = n - 1;
  pending_ = members_;
  reduced_ = false;
}

void Zero3Driver::pre_backward(int u) {
  std::lock_guard<std::mutex> lock(mu_);
  const int k = pos_[size_t(u)];
  if (!params_->gathered(u) && (!reshard_ || k > bcur_))  // (a gathered one was prefetched or kept)
    throw std::logic_error("parallel/zero3_driver: the backward reached unit " + std::to_string(u) +
                           (reshard_ ? " after an earlier unit of the forward order, or twice"
                                     : " after its backward was over, or one whose forward did not run"));
  backward_cursor_to(k - prefetch_, k);
  // MPI: a reduction in flight is completed at the unit's first gradient (on_grad_ready), not here; CUDA:
  // completed reductions are retired as they are found.
  if (!mpi_collect_) grads_->poll();
  params_->wait(u);
  grads_->attach(u);
}

void Zero3Driver::backward_cursor_to(int lowest, int running) {
  // Positions -prefetch .. -1 gather nothing; they only move the reductions on (down to position 1).
  for (; bcur_ >= -prefetch_ && bcur_ >= lowest; --bcur_) {
    const int q = bcur_;
    const int v = q >= 0 ? order_[size_t(q)] : -1;
    if (reshard_ && v >= 0) {  // (without reshard the units that ran are still gathered; the others unneeded)
      params_->gather_start(v);
      if (q != running && !ran_[size_t(v)]) params_->release(v);  // not run by this rank: for the others
    }
    // The units above q + prefetch have had their backward on every rank that ran them (the backward is at
    // q + prefetch or below): their reductions start here, a fixed point of the cursor, so every rank issues
    // gathers and reductions in the same sequence (one NCCL communicator runs its ops in issue order).
    if (last_) start_reductions_from(q + prefetch_ + 1);
  }
}

void Zero3Driver::start_reductions_from(int lowest_pos) {
  while (rnext_ < order_.size()) {  // red_order_ starts with the hooked units, last position first
    const int u = red_order_[rnext_];
    if (pos_[size_t(u)] < lowest_pos) return;
    grads_->reduce_start(u);
    reduce_started_[size_t(u)] = 1;
    ++rnext_;
    // Only the new reduction in flight: the older one had a whole unit's backward to complete, and every rank
    // started it at the same cursor point (no deadlock); each holds a unit's gradient and buffers.
    grads_->limit_in_flight(1);
  }
}

void Zero3Driver::on_grad_ready(size_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (suspended_) return;
  c10::NoGradGuard no_grad;
  const int u = unit_of_param_[index];
  if (reduce_started_[size_t(u)])
    throw std::logic_error("parallel/zero3_driver: parameter '" + params_->params()[index].first +
                           "' got its gradient after its unit's reduction had started (a gradient that "
                           "reached a unit after the backward moved past it)");
  at::Tensor p = params_->params()[index].second;
  at::Tensor g = p.grad();
  if (!grads_->attached(u)) grads_->attach(u);  // (its output hook did not run: a gradient that bypassed it)
  at::Tensor view = p.grad();
  if (g.defined() && g.data_ptr() != view.data_ptr()) {
    view.add_(g);  // autograd made a fresh .grad: take its values into the unit buffer
    p.mutable_grad() = view;
  }
  // MPI: at a hooked unit's first gradient of this backward, the reduction the backward started when it
  // reached the unit (the unit above's) is completed, and only there (the other hooks progress it without
  // freeing it), so when its bytes are freed does not depend on the peers' timing: without checkpointing
  // early in the unit's backward, before it peaks; for a checkpointed unit after its recompute and backward
  // (its parameter gradients all come out of the checkpoint node at the end). The peers progress it meanwhile
  // or soon: they started it before their own backward of the unit. (Waiting for it before the unit's
  // recompute instead makes a rank wait through a peer's recompute, which makes no MPI call: measured +7% to
  // +27% per step at 2 ranks with checkpointing, docs/plan.md.)
  if (mpi_collect_ && pos_[size_t(u)] >= 0 && pending_[size_t(u)] == members_[size_t(u)])
    grads_->limit_in_flight(0);
  if (--pending_[size_t(u)] == 0 && pos_[size_t(u)] >= 0) params_->release(u);  // its backward is over
  if (mpi_collect_)
    grads_->progress();
  else
    grads_->poll();
  params_->progress();
}

void Zero3Driver::finish_reductions() {
  for (; rnext_ < red_order_.size(); ++rnext_) grads_->reduce_start(red_order_[rnext_]);
  grads_->finish();
  rnext_ = 0;
  std::fill(reduce_started_.begin(), reduce_started_.end(), 0);
  reduced_ = true;
  last_ = false;
}

void Zero3Driver::end_backward() {
  std::lock_guard<std::mutex> lock(mu_);
  backward_cursor_to(-prefetch_, -1);  // the gathers (and reductions) the backward did not reach
  for (int u = 0; u < params_->num_units(); ++u) params_->release(u);
  if (last_) finish_reductions();
  reset_pass();
}

void Zero3Driver::reset_pass() {
  std::fill(ran_.begin(), ran_.end(), 0);
  pending_ = members_;
  fcur_ = 0;
  bcur_ = -prefetch_ - 1;
}

void Zero3Driver::idle_micro_batch(bool last) {
  set_last_micro_batch(last);
  begin_forward();
  end_forward();
  end_backward();
}

void Zero3Driver::all_reduce_after_gradients(at::Tensor& t, ReduceOp op) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!reduced_) finish_reductions();
  }
  comm_->all_reduce(t, op);
}

StepResult Zero3Driver::step(const std::vector<double>& lrs) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!reduced_) finish_reductions();
  }
  const StepResult r = opt_->step(lrs);
  reduced_ = false;
  return r;
}

std::string Zero3Driver::describe() const {
  return "optimizer: ZeRO-3, " + std::to_string(num_units()) + " parameter units (" +
         std::to_string(num_hooked_units()) + " gathered around their forward and backward), prefetch " +
         std::to_string(prefetch()) + (reshard_after_forward() ? "" : ", no reshard after forward") +
         (offload_ ? "; fp32 master + moments offloaded to host memory" : "");
}

void Zero3Driver::gather_all() {
  std::lock_guard<std::mutex> lock(mu_);
  suspended_ = true;
  for (int u = 0; u < params_->num_units(); ++u) params_->gather(u);
}

void Zero3Driver::release_all() {
  std::lock_guard<std::mutex> lock(mu_);
  for (int u = 0; u < params_->num_units(); ++u) params_->release(u);
  suspended_ = false;
}

}  // namespace gmod

#include "parallel/zero3_params.h"

#include <c10/core/GradMode.h>
#include <c10/core/StorageImpl.h>

#include <algorithm>
#include <stdexcept>

namespace gmod {
namespace {

std::string where(const std::string& name) { return "parallel/zero3_params: parameter '" + name + "'"; }

// The storage of a unit buffer: dropped and re-allocated in place, so every view (parameters, tensors saved
// by autograd) follows it.
void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(c10::DataPtr(nullptr, s->device()));
  s->set_nbytes(0);
}

void alloc_storage(const at::Tensor& t, size_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (!s->allocator()) throw std::runtime_error("parallel/zero3_params: unit buffer has no allocator");
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

}  // namespace

Zero3Params::Zero3Params(NamedParams params, const std::vector<int>& unit, std::shared_ptr<Comm> comm)
    : params_(std::move(params)), comm_(std::move(comm)) {
  if (!comm_) throw std::runtime_error("parallel/zero3_params: null Comm");
  if (params_.empty()) throw std::runtime_error("parallel/zero3_params: no parameters");
  if (unit.size() != params_.size())
    throw std::runtime_error("parallel/zero3_params: " + std::to_string(unit.size()) + " unit indices for " +
                             std::to_string(params_.size()) + " parameters");
  const at::ScalarType dtype = params_.front().second.scalar_type();
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& [name, p] = params_[i];
    if (!p.defined() || !at::isFloatingType(p.scalar_type()) || p.scalar_type() != dtype)
      throw std::runtime_error(where(name) +
                               " must be a defined floating tensor of the first parameter's dtype");
    if (p.device() != comm_->device())
      throw std::runtime_error(where(name) + " is on " + p.device().str() + ", the communicator on " +
                               comm_->device().str());
    const int prev = i == 0 ? -1 : unit[i - 1];
    if (unit[i] != prev && unit[i] != prev + 1)
      throw std::runtime_error(where(name) + " has unit " + std::to_string(unit[i]) + " after unit " +
                               std::to_string(prev) +
                               ": units must be runs of consecutive parameters numbered 0, 1, ...");
  }
  c10::NoGradGuard no_grad;
  layout_ = FlatParamLayout::from_params(params_, comm_->world_size());
  const auto opt = params_.front().second.options().requires_grad(false);
  const auto& e = layout_.entries();
  for (size_t i = 0; i < params_.size();) {
    size_t j = i;
    while (j < params_.size() && unit[j] == unit[i]) ++j;
    const int64_t lo = e[i].offset, hi = e[j - 1].offset + e[j - 1].numel;
    at::Tensor buf = at::empty({hi - lo}, opt);
    for (size_t k = i; k < j; ++k) {
      at::Tensor view = buf.narrow(0, e[k].offset - lo, e[k].numel).view(e[k].shape);
      view.copy_(params_[k].second.detach());
      params_[k].second.set_data(view);
    }
    full_.push_back(buf);
    unit_range_.push_back({lo, hi});
    gathered_.push_back(true);
    pending_.emplace_back();
    i = j;
  }
  shard_ = at::zeros({layout_.shard_size()}, opt);
  for (int u = 0; u < num_units(); ++u) store(u);
}

void Zero3Params::store(int u) {
  if (!gathered(u))
    throw std::runtime_error("parallel/zero3_params: store of released unit " + std::to_string(u));
  wait(u);
  c10::NoGradGuard no_grad;
  const auto [lo, hi] = unit_range_[size_t(u)];
  const auto [sb, se] = layout_.shard_range(comm_->rank());
  const int64_t a = std::max(lo, sb), b = std::min(hi, se);
  if (a < b) shard_.narrow(0, a - sb, b - a).copy_(full_[size_t(u)].narrow(0, a - lo, b - a));
}

void Zero3Params::gather(int u) {
  gather_start(u);
  wait(u);
}

void Zero3Params::gather_start(int u) {
  if (gathered(u)) return;
  c10::NoGradGuard no_grad;
  at::Tensor& buf = full_[size_t(u)];
  const auto [lo, hi] = unit_range_[size_t(u)];
  alloc_storage(buf, size_t(hi - lo) * buf.element_size());
  gathered_[size_t(u)] = true;
  // Rank k holds the part of the unit inside its shard (a unit spans one or two shards at real sizes): an
  // all-gather with uneven blocks, in place.
  const int rank = comm_->rank();
  std::vector<int64_t> counts(size_t(comm_->world_size()), 0);
  for (int k = 0; k < comm_->world_size(); ++k) {
    const auto [sb, se] = layout_.shard_range(k);
    const int64_t a = std::max(lo, sb), b = std::min(hi, se);
    if (a >= b) continue;
    counts[size_t(k)] = b - a;
    if (k == rank) buf.narrow(0, a - lo, b - a).copy_(shard_.narrow(0, a - sb, b - a));
  }
  pending_[size_t(u)] = comm_->all_gather_v_start(buf, std::move(counts));
}

void Zero3Params::wait(int u) {
  auto& r = pending_.at(size_t(u));
  if (!r) return;
  std::unique_ptr<CommRequest> req = std::move(r);
  req->wait();
}

void Zero3Params::progress() {
  for (auto& r : pending_)
    if (r) r->test();
}

void Zero3Params::release(int u) {
  if (!gathered(u)) return;
  wait(u);
  free_storage(full_[size_t(u)]);
  gathered_[size_t(u)] = false;
}

int64_t Zero3Params::bytes_held() const {
  int64_t b = int64_t(shard_.storage().nbytes());
  for (const auto& t : full_) b += int64_t(t.storage().nbytes());
  return b;
}

}  // namespace gmod

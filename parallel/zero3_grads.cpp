#include "parallel/zero3_grads.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <stdexcept>

namespace gmod {

Zero3Grads::Zero3Grads(Zero3Params& params, at::ScalarType reduce_dtype)
    : params_(params), reduce_dtype_(reduce_dtype) {
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

void Zero3Grads::reduce(int u) {
  attach(u);  // a unit none of whose parameters got a gradient still joins the collective (with zeros)
  c10::NoGradGuard no_grad;
  const auto [lo, hi] = params_.unit_range(u);
  const FlatParamLayout& layout = params_.layout();
  Comm& comm = params_.comm();
  const int world = comm.world_size(), rank = comm.rank();
  const int64_t S = layout.shard_size();
  std::vector<int64_t> counts(size_t(world), 0);
  for (int k = 0; k < world; ++k)
    counts[size_t(k)] = std::max<int64_t>(0, std::min(hi, (k + 1) * S) - std::max(lo, k * S));
  at::Tensor& g = grad_[size_t(u)];
  at::Tensor red = g.scalar_type() == reduce_dtype_ ? g : g.to(reduce_dtype_);
  at::Tensor out = at::empty({counts[size_t(rank)]}, red.options());
  comm.reduce_scatter_v(red, out, counts, ReduceOp::Avg);
  if (out.numel() > 0) gshard_.narrow(0, std::max(lo, rank * S) - rank * S, out.numel()).add_(out);
  for (size_t i : members_[size_t(u)]) params_.params()[i].second.mutable_grad() = at::Tensor();
  g = at::Tensor();
}

int64_t Zero3Grads::bytes_held() const {
  int64_t b = int64_t(gshard_.storage().nbytes());
  for (const auto& t : grad_)
    if (t.defined()) b += int64_t(t.storage().nbytes());
  return b;
}

}  // namespace gmod

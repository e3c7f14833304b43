#include "model/unit_checkpoint.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <stdexcept>
#include <unordered_set>

namespace gmod {
namespace {

using torch::autograd::variable_list;

class CheckpointedUnitBackward final : public torch::autograd::Node {
 public:
  CheckpointedUnitBackward(std::function<at::Tensor(const at::Tensor&)> fn, const at::Tensor& x,
                           const std::vector<at::Tensor>& params, std::string what)
      : fn_(std::move(fn)), what_(std::move(what)), x_requires_grad_(x.requires_grad()), x_(x, false) {
    for (const auto& p : params) params_.emplace_back(p, false);
  }
  std::string name() const override { return "CheckpointedUnitBackward"; }
  void release_variables() override {
    x_.reset_data();
    for (auto& p : params_) p.reset_data();
  }
  variable_list apply(variable_list&& grads) override {
    if (grads.size() != 1)
      throw std::logic_error("activation checkpointing, " + what_ + ": expected one output gradient");
    const at::Tensor x = x_.unpack();
    variable_list params;
    for (const auto& p : params_) params.push_back(p.unpack());
    variable_list result(1 + params.size());
    if (!grads[0].defined()) return result;
    at::AutoGradMode grad_mode(true);
    at::Tensor xd = x.detach();
    if (x_requires_grad_) xd.requires_grad_(true);
    const at::Tensor y = fn_(xd);
    if (!y.requires_grad()) return result;
    variable_list wrt;
    if (x_requires_grad_) wrt.push_back(xd);
    wrt.insert(wrt.end(), params.begin(), params.end());
    variable_list g = torch::autograd::grad({y}, wrt, {grads[0]}, false, false, /*allow_unused=*/true);
    size_t k = 0;
    if (x_requires_grad_) result[0] = g[k++];
    for (size_t i = 0; i < params.size(); ++i) result[1 + i] = g[k++];
    return result;
  }

 private:
  std::function<at::Tensor(const at::Tensor&)> fn_;
  std::string what_;
  bool x_requires_grad_;
  torch::autograd::SavedVariable x_;
  std::vector<torch::autograd::SavedVariable> params_;
};

}  // namespace

at::Tensor checkpointed_unit(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& x,
                             const std::vector<at::Tensor>& params, const std::string& what) {
  if (!at::GradMode::is_enabled()) return fn(x);
  std::vector<at::Tensor> used;
  std::unordered_set<const void*> seen;
  for (const auto& p : params)
    if (p.defined() && p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) used.push_back(p);
  if (!x.requires_grad() && used.empty()) return fn(x);
  at::Tensor y;
  {
    at::NoGradGuard no_grad;
    y = fn(x.detach());
  }
  std::shared_ptr<CheckpointedUnitBackward> node(new CheckpointedUnitBackward(fn, x, used, what),
                                                 torch::autograd::deleteNode);
  variable_list in{x};
  in.insert(in.end(), used.begin(), used.end());
  node->set_next_edges(torch::autograd::collect_next_edges(in));
  at::Tensor out = y.detach();
  torch::autograd::set_history(out, node);
  return out;
}

}  // namespace gmod

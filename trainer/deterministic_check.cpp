#include "trainer/deterministic_check.h"

#include <exception>
#include <functional>
#include <stdexcept>

namespace gmod {

std::string deterministic_conflicts(const std::vector<DeterministicUse>& uses) {
  std::string msg, remedies;
  for (const auto& u : uses) {
    if (u.site.empty() || u.runs) continue;
    msg += "\n  " + u.site + ": the " + u.op + " has no deterministic CUDA kernel in this LibTorch";
    if (!u.remedy.empty() && remedies.find(u.remedy) == std::string::npos)
      remedies += (remedies.empty() ? "" : "; ") + u.remedy;
  }
  if (msg.empty()) return "";
  return "deterministic: true on CUDA cannot run this model (checked at start, before any step):" + msg +
         "\n  set deterministic: false" + (remedies.empty() ? "" : ", or change the part named above (" + remedies + ")");
}

namespace {

bool runs(const at::Device& device, const std::function<at::Tensor(const at::Tensor&)>& f) {
  if (!device.is_cuda()) return true;
  try {
    auto x = at::rand({1, 1, 4, 4}, at::TensorOptions().device(device)).requires_grad_(true);
    f(x).sum().backward();
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

bool bilinear_backward_runs(const at::Device& device) {
  return runs(device, [](const at::Tensor& x) { return at::upsample_bilinear2d(x, {8, 8}, true); });
}

bool float_cumsum_runs(const at::Device& device) {
  return runs(device, [](const at::Tensor& x) { return x.flip({2}).cumsum(2).flip({2}); });
}

bool deterministic_op_runs(const std::string& op, const at::Device& device) {
  if (op == "float cumsum") return float_cumsum_runs(device);
  if (op == "bilinear resize backward") return bilinear_backward_runs(device);
  throw std::invalid_argument("deterministic check: unknown op \"" + op + "\"");
}

}  // namespace gmod

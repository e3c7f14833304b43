#include "model/unit_hooks.h"

#include <atomic>

namespace gmod {
namespace {
std::atomic<UnitHooks*>& installed() {
  static std::atomic<UnitHooks*> h{nullptr};
  return h;
}
}  // namespace

void set_unit_hooks(UnitHooks* hooks) { installed().store(hooks); }

UnitHooks* unit_hooks() { return installed().load(); }

at::Tensor run_unit(const torch::nn::Module& unit, const std::function<at::Tensor()>& fn) {
  UnitHooks* h = unit_hooks();
  if (!h) return fn();
  h->pre_forward(unit);
  return h->post_forward(unit, fn());
}

}  // namespace gmod

// UnitHooks: the points where a training strategy installed from outside the model runs around one unit of it
// (a decoder layer, a CLIP encoder layer, a ConvNeXt stage). ZeRO-3 (parallel/zero3_driver.h) uses them to
// gather a unit's sharded parameters before it runs, release them after, and hook the unit's output gradient
// to gather them again for the backward. model/ only announces its units; it knows nothing of what the hooks
// do, and with no hooks installed nothing happens. Process-wide, like
// torch.nn.modules.module.register_module_forward_pre_hook: the hooks decide by the module's address whether
// it is one of theirs.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

namespace gmod {

class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  // Before `unit`'s forward.
  virtual void pre_forward(const torch::nn::Module& unit) = 0;
  // After it: `out` is the unit's output [.., D]; returns it (the hooks may attach a gradient hook to it).
  virtual at::Tensor post_forward(const torch::nn::Module& unit, const at::Tensor& out) = 0;
};

// The installed hooks (one process-wide slot). Inline, so that a strategy outside model/ (parallel/) installs itself
// without linking model/.
inline std::atomic<UnitHooks*>& installed_unit_hooks() {
  static std::atomic<UnitHooks*> h{nullptr};
  return h;
}
// Installs `hooks` (nullptr: none); the caller keeps them alive while installed.
inline void set_unit_hooks(UnitHooks* hooks) { installed_unit_hooks().store(hooks); }
inline UnitHooks* unit_hooks() { return installed_unit_hooks().load(); }

// fn() as unit `unit`: pre_forward, fn, post_forward when hooks are installed; fn() otherwise.
at::Tensor run_unit(const torch::nn::Module& unit, const std::function<at::Tensor()>& fn);

// The units of `model` (a MultimodalLM, or any module holding these blocks) in forward order: ConvNeXt stages
// (LLaVA-HR's slow tower runs before the CLIP layers), CLIP encoder layers, Qwen2.5-VL's vision blocks and
// merger, decoder layers. Only outermost matches
// count (a block inside a block is part of it). What ZeRO-3 gathers around (parallel/zero3_driver.h).
std::vector<std::shared_ptr<torch::nn::Module>> hooked_units(torch::nn::Module& model);

}  // namespace gmod

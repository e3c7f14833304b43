// TowerCosts: what the memory plan (trainer/plan/memory_plan.h) needs from a vision tower, reported by the
// tower's own cost model instead of a branch per model type inside the planner: its parameters, its ZeRO-3
// hooked units, the pixels and LLM tokens of one visual input, and the activations its forward saves for the
// backward. Each count mirrors the module it stands for. Implemented for the Qwen2.5-VL and Qwen3-VL encoders
// (model/qwen2_5_vl_vision.h, model/qwen3_vl_vision.h); the
// CLIP-family towers (LLaVA-1.5, LLaVA-HR, Mini-Gemini) are still counted by the planner's own terms
// (param_counts.cpp, tower_activation_plan.h), and tower_costs() returns nullptr for them.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "model/config.h"
#include "trainer/plan/tower_activation_plan.h"

namespace gmod {

// The visual inputs a plan assumes, for towers of variable patch grids: every image (or video) at the processor's
// largest size. `frames` 1: an image (the processor repeats it to temporal_patch_size frames); more: a video of
// that many frames at max_pixels each.
struct VisualInputs {
  int64_t max_pixels = 28 * 28 * 1280;  // Qwen2-VL's image processor default (size.longest_edge)
  int64_t frames = 1;
};

class TowerCosts {
 public:
  virtual ~TowerCosts() = default;
  // Every parameter of the tower, and of the projector that follows it (0 when the tower projects itself).
  virtual int64_t params() const = 0;
  virtual int64_t projector_params() const = 0;
  // The parameters of each ZeRO-3 hooked unit (model/unit_hooks.h hooked_units), in forward order.
  virtual std::vector<int64_t> hooked_units() const = 0;
  // One visual input: the patches the tower runs on, the pixel values' elements, the LLM tokens it becomes.
  virtual int64_t patches(const VisualInputs& v) const = 0;
  virtual int64_t pixel_elements(const VisualInputs& v) const = 0;
  virtual int64_t llm_tokens(const VisualInputs& v) const = 0;
  // The patch grid (t, h, w) of one such input, t * h * w = patches(v): a processor's output for an image of that
  // size, as near square as whole merge blocks allow (the memory probe feeds it; trainer/plan/memory_probe.h).
  virtual std::array<int64_t, 3> grid(const VisualInputs& v) const = 0;
  // `inputs` visual inputs through the tower in the compute dtype (`e` bytes): with `train` (freeze.vision off)
  // what its forward saves for the backward, its largest checkpoint unit, and the peak of its own backward; with
  // `checkpointing` each unit keeps only its input. Nothing when the tower is frozen (no graph is recorded).
  virtual TowerActivations activations(int64_t inputs, const VisualInputs& v, int64_t e, bool train,
                                       bool checkpointing) const = 0;
};

// The cost model of the config's tower; nullptr for the towers the planner still counts itself (CLIP family) and
// for a text-only model.
std::unique_ptr<TowerCosts> tower_costs(const LlavaConfig& c);

// The crops and LLM tokens of one image for the CLIP family: {1, image_seq_length()}. For AnyRes (LLaVA-NeXT) the
// most one image can take: every image's grid is one of the pinpoints', and an image of a pinpoint's size fills its
// grid (nothing cut), so the bound is the largest over the pinpoints of 1 + rows * cols tiles and of
// side^2 + rows * side * (cols * side + 1) tokens (each maximised on its own; model/anyres_grid.h). LLaVA-OneVision's
// anyres_max_N: the tokens are anyres_max_image_tokens' (every extent the unpad can leave, after the downscale).
struct AnyresBound {
  int64_t tiles = 1;
  int64_t tokens = 0;
};
AnyresBound anyres_image_bound(const LlavaConfig& c);

}  // namespace gmod

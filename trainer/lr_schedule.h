// Learning-rate schedule: linear warmup to the peak, then cosine decay to a floor over the run's horizon; per
// parameter group the same shape from the group's own peak (lr_at(step, peak)).
// The only state is the number of optimizer steps taken, so a checkpoint restores it exactly.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>

namespace gmod {

class LRSchedule {
 public:
  // total_steps: the horizon (the LR reaches min_lr after it); warmup_steps < total_steps.
  LRSchedule(double peak_lr, double min_lr, int64_t warmup_steps, int64_t total_steps);

  // LR of the step that follows `steps_done` completed steps:
  //   s < W:  peak * (s + 1) / W                       (the first step already moves; the W-th reaches the peak)
  //   s >= W: min + (peak - min) * (1 + cos(pi * p)) / 2,  p = min(1, (s - W) / max(1, T - W))
  double lr_at(int64_t steps_done) const { return lr_at(steps_done, peak_); }
  // The same shape for a parameter group whose peak is `peak` (optimizer.groups): the floor scales with it,
  // min * (peak / peak_lr), so every group's LR is its peak times the same factor (torch's LambdaLR over
  // param_groups, as HF/LLaVA schedule mm_projector_lr); peak == peak_lr gives lr_at(steps_done) bitwise.
  double lr_at(int64_t steps_done, double peak) const;
  double current() const { return lr_at(step_); }
  void advance() { ++step_; }
  int64_t step() const { return step_; }

  int64_t warmup_steps() const { return warmup_; }
  int64_t total_steps() const { return total_; }

  // {"step", "peak_lr", "min_lr", "warmup_steps", "total_steps"}.
  nlohmann::json state() const;
  // Restores the step. Returns "" or a description of how the saved schedule differs from this one (e.g. a longer
  // max_steps on resume); the configured shape is kept either way.
  std::string load_state(const nlohmann::json& j);

 private:
  double peak_, min_;
  int64_t warmup_, total_;
  int64_t step_ = 0;
};

}  // namespace gmod

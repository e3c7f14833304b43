#include "trainer/lr_schedule.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace gmod {

LRSchedule::LRSchedule(double peak_lr, double min_lr, int64_t warmup_steps, int64_t total_steps)
    : peak_(peak_lr), min_(min_lr), warmup_(std::max<int64_t>(0, warmup_steps)), total_(total_steps) {
  if (total_steps < 1) throw std::invalid_argument("LRSchedule: total_steps must be >= 1");
  if (min_lr < 0 || min_lr > peak_lr) throw std::invalid_argument("LRSchedule: need 0 <= min_lr <= peak_lr");
}

double LRSchedule::lr_at(int64_t s, double peak) const {
  if (s < warmup_) return peak * double(s + 1) / double(warmup_);
  const double min = peak == peak_ ? min_ : min_ * (peak / peak_);
  const double p = std::min(1.0, double(s - warmup_) / double(std::max<int64_t>(1, total_ - warmup_)));
  return min + (peak - min) * 0.5 * (1.0 + std::cos(M_PI * p));
}

nlohmann::json LRSchedule::state() const {
  return {{"step", step_}, {"peak_lr", peak_}, {"min_lr", min_}, {"warmup_steps", warmup_}, {"total_steps", total_}};
}

std::string LRSchedule::load_state(const nlohmann::json& j) {
  const bool same = j.at("peak_lr").get<double>() == peak_ && j.at("min_lr").get<double>() == min_ &&
                    j.at("warmup_steps").get<int64_t>() == warmup_ && j.at("total_steps").get<int64_t>() == total_;
  step_ = j.at("step").get<int64_t>();
  if (same) return "";
  nlohmann::json now = state();
  now.erase("step");
  nlohmann::json saved = j;
  saved.erase("step");
  return "LR schedule changed on resume: checkpoint " + saved.dump() + ", now " + now.dump();
}

}  // namespace gmod

// StepProfiler: see step_profiler.h.
#include "trainer/step_profiler.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <set>
#include <stdexcept>

namespace gmod {
namespace prof = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

StepRange parse_step_range(const std::string& spec, const std::string& key) {
  StepRange r;
  if (spec.empty()) return r;
  auto number = [&](const std::string& s) -> int64_t {
    if (s.empty() || s.size() > 12 || !std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit((unsigned char)c); }))
      throw std::invalid_argument(key + ": \"" + spec + "\" is not A-B (two step numbers, 1 <= A <= B) or one step");
    return std::stoll(s);
  };
  const size_t dash = spec.find('-');
  r.first = number(spec.substr(0, dash));
  r.last = dash == std::string::npos ? r.first : number(spec.substr(dash + 1));
  if (r.first < 1 || r.last < r.first)
    throw std::invalid_argument(key + ": \"" + spec + "\" must have 1 <= A <= B (steps count from 1)");
  return r;
}

StepProfiler::StepProfiler(StepRange range, std::string run_dir, int rank, bool cuda,
                           std::function<void(const std::string&)> print)
    : range_(range), run_dir_(std::move(run_dir)), rank_(rank), cuda_(cuda), print_(std::move(print)) {}

StepProfiler::~StepProfiler() {
  try {
    stop();
  } catch (...) {  // a destructor during unwinding must not throw; the trace is then lost, nothing else
  }
}

void StepProfiler::before_step(int64_t step) {
  if (range_.empty() || active_ || step < range_.first || step > range_.last) return;
  const impl::ProfilerConfig cfg(impl::ProfilerState::KINETO, /*report_input_shapes=*/true,
                                 /*profile_memory=*/false);
  std::set<impl::ActivityType> acts{impl::ActivityType::CPU};
  if (cuda_) acts.insert(impl::ActivityType::CUDA);
  prof::prepareProfiler(cfg, acts);
  prof::enableProfiler(cfg, acts);
  active_ = true;
  path_ = (std::filesystem::path(run_dir_) / "profile" /
           ("trace-rank-" + std::to_string(rank_) + "-steps-" + std::to_string(step) + "-" +
            std::to_string(range_.last) + ".json"))
              .string();
  if (print_) print_("profile: recording steps " + std::to_string(step) + "-" + std::to_string(range_.last));
}

void StepProfiler::after_step(int64_t step) {
  if (active_ && step >= range_.last) stop();
}

void StepProfiler::stop() {
  if (!active_) return;
  active_ = false;
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<prof::ProfilerResult> r = prof::disableProfiler();
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path());
  r->save(path_);
  if (print_)
    print_("profile: " + path_ + " (" + std::to_string(r->events().size()) + " events, written in " +
           std::to_string(int(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1000)) +
           " ms; open it at ui.perfetto.dev)");
}

}  // namespace gmod

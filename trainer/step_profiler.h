// metrics.profile_steps "A-B" (gmod train --profile-steps A-B): LibTorch's Kineto profiler records optimizer steps
// A..B (1-based, inclusive) of this run on every rank and writes one Chrome/Perfetto trace per rank,
// <run_dir>/profile/trace-rank-R-steps-A-B.json (open it at ui.perfetto.dev or chrome://tracing). It holds the CPU
// operators (aten::*), on CUDA also the kernels, memory copies and NCCL kernels, and gmod's own ranges
// (gmod::data_wait, gmod::forward, gmod::decoder_layer / gmod::mod_layer / gmod::mod_routing, gmod::backward,
// gmod::reduce, gmod::optimizer, gmod::checkpoint; RECORD_USER_SCOPE, free when no profiler runs).
// Steps outside A..B run unprofiled; a run that ends (or is stopped) inside A..B writes what it recorded.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace gmod {

struct StepRange {
  int64_t first = 0, last = -1;  // empty when last < first
  bool empty() const { return last < first; }
};
// "A-B" with 1 <= A <= B, or "A" (one step); "" = none. Throws std::invalid_argument naming `key` otherwise.
StepRange parse_step_range(const std::string& spec, const std::string& key);

class StepProfiler {
 public:
  StepProfiler(StepRange range, std::string run_dir, int rank, bool cuda,
               std::function<void(const std::string&)> print);
  ~StepProfiler();  // writes the trace of a range cut short
  void before_step(int64_t step);  // step: the 1-based step about to run
  void after_step(int64_t step);   // the step just completed (its checkpoint included)
  const std::string& trace_path() const { return path_; }

 private:
  void stop();
  StepRange range_;
  std::string run_dir_, path_;
  int rank_;
  bool cuda_, active_ = false;
  std::function<void(const std::string&)> print_;
};

}  // namespace gmod

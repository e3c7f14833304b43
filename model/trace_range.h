// A named range in profiler traces (gmod train --profile-steps, trainer/step_profiler.h): from construction to end()
// or destruction. When no profiler runs it costs one check of a thread-local flag (at::RecordFunction).
#pragma once

#include <ATen/record_function.h>

#include <string_view>

namespace gmod {

class TraceRange {
 public:
  explicit TraceRange(std::string_view name) : rf_(at::RecordScope::USER_SCOPE) {
    if (rf_.isActive()) rf_.before(name);
  }
  void end() { rf_.end(); }

 private:
  at::RecordFunction rf_;
};

}  // namespace gmod

#include "model/cpu_kernels.h"

#include <ATen/Version.h>
#include <ATen/core/dispatch/Dispatcher.h>

namespace gmod {

std::string cpu_capability() { return at::get_cpu_capability(); }

bool cpu_bf16_uses_onednn() {
  // The operator LibTorch's own checks stand behind (ideep's bf16 support, which honours ONEDNN_MAX_CPU_ISA); a
  // build without oneDNN does not register it.
  static const bool uses = [] {
    auto op = c10::Dispatcher::singleton().findSchema({"mkldnn::_is_mkldnn_bf16_supported", ""});
    return op.has_value() && op->typed<bool()>().call();
  }();
  return uses;
}

}  // namespace gmod

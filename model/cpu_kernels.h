// Which CPU kernels this process's LibTorch runs: ATen's vectorised set (ATEN_CPU_CAPABILITY caps it) and whether
// bf16 matmuls, convolutions and their backward go through oneDNN (only where oneDNN has bf16 support on this CPU:
// AVX-512 and up; ONEDNN_MAX_CPU_ISA=AVX2 turns it off as on an AVX2 CPU) or through ATen's own bf16 kernels. The
// memory plan's CPU bf16 terms differ between the two (trainer/plan/tower_activation_plan.h); `gmod info` prints
// both; tests/lower_isa.sh runs tests under the lower set.
#pragma once

#include <string>

namespace gmod {

// ATen's CPU capability as LibTorch names it: "AVX512", "AVX2", "DEFAULT", ...
std::string cpu_capability();

// True when LibTorch runs bf16 through oneDNN on this CPU (torch.ops.mkldnn._is_mkldnn_bf16_supported()).
bool cpu_bf16_uses_onednn();

}  // namespace gmod

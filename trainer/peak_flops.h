// Peak dense matrix-multiply throughput of an accelerator, for MFU (trainer/metrics.h): one table, looked up
// by the device name CUDA reports (cudaDeviceProp::name, e.g. "NVIDIA A100-SXM4-80GB", "NVIDIA H100 PCIe").
// Figures are the vendors' datasheet numbers per GPU without structured sparsity: bf16 on the tensor cores,
// fp32 on the plain FP32 units (gmod does not enable TF32). The table with its sources is in peak_flops.cpp;
// metrics.peak_tflops overrides it (a GPU it lacks, a clock-limited part).
#pragma once

#include <string>

namespace gmod {

struct PeakFlops {
  double bf16_tflops = 0, fp32_tflops = 0;  // 0: unknown device
  std::string model;                        // the table row that matched ("H100 SXM"), empty when none did
};

// The row whose tokens all occur in `device_name` (split at non-alphanumerics, case-insensitive; the most
// specific rows first, so "H100 PCIe" is not read as an H100 SXM nor "GH200" as an H200). Unknown: zeros,
// empty model.
PeakFlops peak_flops_of(const std::string& device_name);

// The name of CUDA device `index` (the current one for -1); empty when built without CUDA or no such device.
std::string cuda_device_name(int index);

}  // namespace gmod

#include "trainer/peak_flops.h"

#include <cctype>
#include <vector>

#ifdef GMOD_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace gmod {
namespace {

struct Row {
  std::vector<const char*> tokens;  // all must occur in the device name (upper case)
  const char* model;
  double bf16, fp32;  // dense TFLOP/s
};

// Sources (datasheets, dense figures; the sparsity figures are twice these):
//  H100 SXM / PCIe / NVL, GH200: NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100):
//    BF16 1,979 / 1,513 / 1,671 with sparsity; FP32 67 / 51 / 60.
//  H200 SXM / NVL: NVIDIA H200 product page (nvidia.com/en-us/data-center/h200): BF16 1,979 / 1,671 with
//  sparsity;
//    FP32 67 / 60.
//  H800: as H100 SXM (same datasheet figures for compute). H20: NVIDIA H20 specifications: BF16 148, FP32 44.
//  A100 (SXM and PCIe, 40/80 GB) and A800: NVIDIA A100 datasheet: BF16 312 (624 sparse), FP32 19.5.
//  L40S: NVIDIA L40S datasheet: BF16 362.05 (733 sparse), FP32 91.6.  L40: NVIDIA L40 datasheet: BF16 181.05,
//  FP32
//    90.5.  L4: NVIDIA L4 datasheet: BF16 121 (242 sparse), FP32 30.3.  A10: NVIDIA A10 datasheet: BF16 125
//    (250 sparse), FP32 31.2.  A40: NVIDIA A40 datasheet: BF16 149.7 (299.4 sparse), FP32 37.4.
//  B200: NVIDIA HGX B200 specifications, per GPU: FP16/BF16 2.25 PFLOPS dense (4.5 sparse), FP32 75 (600 for
//  8). MI300X: AMD Instinct MI300X datasheet: BF16 1,307.4 dense, FP32 (vector) 163.4. (ROCm builds report it
//  as cuda.)
const std::vector<Row>& table() {
  static const std::vector<Row> rows = {
      {{"GH200"}, "GH200 (H100)", 989.4, 66.9},
      {{"H100", "PCIE"}, "H100 PCIe", 756.5, 51.2},
      {{"H100", "NVL"}, "H100 NVL", 835.5, 60.0},
      {{"H100"}, "H100 SXM", 989.4, 66.9},
      {{"H200", "NVL"}, "H200 NVL", 835.5, 60.0},
      {{"H200"}, "H200 SXM", 989.4, 66.9},
      {{"H800"}, "H800", 989.4, 66.9},
      {{"H20"}, "H20", 148.0, 44.0},
      {{"A100"}, "A100", 312.0, 19.5},
      {{"A800"}, "A800", 312.0, 19.5},
      {{"L40S"}, "L40S", 362.05, 91.6},
      {{"L40"}, "L40", 181.05, 90.5},
      {{"L4"}, "L4", 121.0, 30.3},
      {{"A40"}, "A40", 149.7, 37.4},
      {{"A10"}, "A10", 125.0, 31.2},
      {{"B200"}, "B200", 2250.0, 75.0},
      {{"MI300X"}, "MI300X", 1307.4, 163.4},
  };
  return rows;
}

std::vector<std::string> tokens_of(const std::string& name) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : name) {
    if (std::isalnum(static_cast<unsigned char>(ch))) {
      cur += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    } else if (!cur.empty()) {
      out.push_back(cur);
      cur.clear();
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

}  // namespace

PeakFlops peak_flops_of(const std::string& device_name) {
  const auto have = tokens_of(device_name);
  for (const Row& r : table()) {
    bool all = true;
    for (const char* t : r.tokens) {
      bool found = false;
      for (const auto& h : have) found = found || h == t;
      all = all && found;
    }
    if (all) return {r.bf16, r.fp32, r.model};
  }
  return {};
}

std::string cuda_device_name(int index) {
#ifdef GMOD_WITH_CUDA
  if (c10::cuda::device_count() <= 0) return "";
  const int i = index >= 0 ? index : c10::cuda::current_device();
  if (i >= c10::cuda::device_count()) return "";
  return at::cuda::getDeviceProperties(i)->name;
#else
  (void)index;
  return "";
#endif
}

}  // namespace gmod

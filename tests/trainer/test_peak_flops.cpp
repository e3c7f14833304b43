// MFU's peak from the device name (trainer/peak_flops.h): the names CUDA reports for the common data-centre
// GPUs map to their datasheet rows, the specific variants are not read as the generic ones, and an unknown
// GPU is 0.
#include <gtest/gtest.h>

#include "trainer/peak_flops.h"

using namespace gmod;

TEST(PeakFlops, DeviceNamesMapToTheirDatasheetRows) {
  struct Case {
    const char* name;
    const char* model;
    double bf16, fp32;
  };
  // Names as nvidia-smi / cudaDeviceProp report them; figures from the vendors' datasheets (dense).
  for (const Case& c : std::vector<Case>{{"NVIDIA A100-SXM4-80GB", "A100", 312, 19.5},
                                         {"NVIDIA A100-PCIE-40GB", "A100", 312, 19.5},
                                         {"NVIDIA A100 80GB PCIe", "A100", 312, 19.5},
                                         {"NVIDIA H100 80GB HBM3", "H100 SXM", 989.4, 66.9},
                                         {"NVIDIA H100 PCIe", "H100 PCIe", 756.5, 51.2},
                                         {"NVIDIA H100 NVL", "H100 NVL", 835.5, 60},
                                         {"NVIDIA H200", "H200 SXM", 989.4, 66.9},
                                         {"NVIDIA H200 NVL", "H200 NVL", 835.5, 60},
                                         {"NVIDIA GH200 480GB", "GH200 (H100)", 989.4, 66.9},
                                         {"NVIDIA L40S", "L40S", 362.05, 91.6},
                                         {"NVIDIA L40", "L40", 181.05, 90.5},
                                         {"NVIDIA L4", "L4", 121, 30.3},
                                         {"NVIDIA A10", "A10", 125, 31.2},
                                         {"NVIDIA H20", "H20", 148, 44}}) {
    const PeakFlops p = peak_flops_of(c.name);
    EXPECT_EQ(p.model, c.model) << c.name;
    EXPECT_DOUBLE_EQ(p.bf16_tflops, c.bf16) << c.name;
    EXPECT_DOUBLE_EQ(p.fp32_tflops, c.fp32) << c.name;
  }
  // The A100 is 3.2x below the H100's 989 that every GPU used to be divided by.
  EXPECT_NEAR(
      peak_flops_of("NVIDIA H100 80GB HBM3").bf16_tflops / peak_flops_of("NVIDIA A100-SXM4-80GB").bf16_tflops,
      3.17, 0.01);
}

TEST(PeakFlops, UnknownDeviceIsZero) {
  for (const char* n : {"", "NVIDIA GeForce GTX 1080", "Tesla V100-SXM2-16GB", "NVIDIA A1000"}) {
    const PeakFlops p = peak_flops_of(n);
    EXPECT_EQ(p.bf16_tflops, 0) << n;
    EXPECT_TRUE(p.model.empty()) << n;
  }
}

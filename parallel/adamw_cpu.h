// The AdamW update of optimizer offload (optimizer.offload: "cpu"): one pass over fp32 master, exp_avg,
// exp_avg_sq and the gradient in host memory, written as plain loops the compiler vectorises (adamw_cpu.cpp
// is built with -O3 -fno-math-errno -ffp-contract=off; check with -fopt-info-vec) and split over ATen's
// intra-op thread pool (at::parallel_for). Bitwise equal to ShardedAdamW's ATen sequence on the CPU (mul_,
// lerp_, mul_, addcmul_, sqrt, div, add_, addcdiv_): every element gets the same roundings in the same order.
// ATen's CPU kernels fuse two of those products into FMAs when its CPU capability is AVX2/AVX512 (lerp: w *
// (end - self) + self; addcmul: (value * t1) * t2 + self) and not at the DEFAULT capability
// (ATEN_CPU_CAPABILITY=default), so the caller passes which rounding ATen uses (adamw_cpu_aten_fuses()) and
// the kernel does the same.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace gmod {

// Per-step scalars, already rounded to fp32 as ATen rounds a double Scalar for an fp32 tensor.
struct AdamWCpuCoeffs {
  float decay_factor = 1.f;  // 1 - lr * weight_decay
  float lerp_weight = 0.1f;  // 1 - beta1 (exp_avg.lerp_(grad, w))
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float bias_correction2_sqrt = 1.f;
  float eps = 1e-8f;
  float neg_step_size = -1e-3f;  // -lr / bias_correction1
  bool fused = true;             // the FMAs of ATen's AVX2/AVX512 kernels (see above)
};

// Coefficients of one step from the doubles ShardedAdamW::step computes.
AdamWCpuCoeffs adamw_cpu_coeffs(double lr, double beta1, double beta2, double eps, double weight_decay,
                                double bias_correction1, double bias_correction2_sqrt);

// True when ATen's CPU kernels in this process fuse lerp/addcmul into FMAs (CPU capability above DEFAULT).
bool adamw_cpu_aten_fuses();

// Updates elements [0, n) of the contiguous fp32 CPU tensors in place. decay: sorted, disjoint [b, e) in the
// tensors' own coordinates that get the decay factor (the rest does not). Runs on at::parallel_for.
void adamw_cpu_update(at::Tensor& master, at::Tensor& exp_avg, at::Tensor& exp_avg_sq, const at::Tensor& grad,
                      const std::vector<std::pair<int64_t, int64_t>>& decay, const AdamWCpuCoeffs& c);

// Parameter groups (optimizer.groups): [begin, end) in the tensors' own coordinates updated with coeffs[coeffs]
// (its lr and weight decay; the moment coefficients are those of coeffs[0]), decayed or not. Sorted, disjoint and
// covering [0, n).
struct AdamWCpuRun {
  int64_t begin = 0, end = 0;
  int coeffs = 0;
  bool decay = false;
};
void adamw_cpu_update(at::Tensor& master, at::Tensor& exp_avg, at::Tensor& exp_avg_sq, const at::Tensor& grad,
                      const std::vector<AdamWCpuRun>& runs, const std::vector<AdamWCpuCoeffs>& coeffs);

// The update of [0, n) on the calling thread, every element decayed or none (exposed for the test).
void adamw_cpu_kernel(float* p, float* m, float* v, const float* g, int64_t n, bool decay,
                      const AdamWCpuCoeffs& c);

}  // namespace gmod

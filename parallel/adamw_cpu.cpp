#include "parallel/adamw_cpu.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <stdexcept>
#include <string>

// The fused variant may use the FMA instructions: ATen only fuses at its AVX2/AVX512 capability, so the CPU
// has them whenever that variant is chosen.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GMOD_FMA_TARGET __attribute__((target("avx2,fma")))
#else
#define GMOD_FMA_TARGET
#endif

namespace gmod {
namespace {

// One element's update, in ATen's order (sharded_adamw.cpp's non-offloaded path):
//   p *= decay_factor                                   (mul_, decay ranges only)
//   m  = lerp(m, g, w)                                  small w: m + w (g - m); else g + (w - 1)(g - m)
//   v  = v * beta2 + ((1 - beta2) g) g                  (mul_, addcmul_)
//   p += (-step_size m) / (sqrt(v) / bc2_sqrt + eps)    (sqrt, div, add_, addcdiv_)
// in two vectorised passes around ATen's own sqrt: LibTorch's CPU sqrt is MKL's vsSqrt, within 1 ulp but not
// correctly rounded (about 16% of random inputs differ from IEEE sqrt by 1 ulp), so the one way to get its
// bits is to call it (at::sqrt_out on a cache-sized block). kFused: the lerp and addcmul products are FMAs,
// as ATen's AVX2/AVX512 kernels compute them.
template <bool kFused, bool kSmall>
inline __attribute__((always_inline)) void moments(float* __restrict m, float* __restrict v,
                                                   const float* __restrict g, int64_t n,
                                                   const AdamWCpuCoeffs& c) {
  const float w = kSmall ? c.lerp_weight : c.lerp_weight - 1.f, b2 = c.beta2, c2 = c.one_minus_beta2;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i], mi = m[i];
    const float d = gi - mi, base = kSmall ? mi : gi;
    const float vb = v[i] * b2, cg = c2 * gi;
    m[i] = kFused ? __builtin_fmaf(w, d, base) : base + w * d;
    v[i] = kFused ? __builtin_fmaf(cg, gi, vb) : vb + cg * gi;
  }
}

// s = sqrt(v) as ATen computes it.
template <bool kDecay>
inline __attribute__((always_inline)) void apply(float* __restrict p, const float* __restrict m,
                                                 const float* __restrict s, int64_t n,
                                                 const AdamWCpuCoeffs& c) {
  const float df = c.decay_factor, bc = c.bias_correction2_sqrt, eps = c.eps, ss = c.neg_step_size;
  for (int64_t i = 0; i < n; ++i) {
    const float den = s[i] / bc + eps;
    const float pi = kDecay ? p[i] * df : p[i];
    p[i] = pi + (ss * m[i]) / den;
  }
}

template <bool kFused>
inline __attribute__((always_inline)) void moments_dispatch(float* m, float* v, const float* g, int64_t n,
                                                            const AdamWCpuCoeffs& c) {
  if (c.lerp_weight < 0.5f && c.lerp_weight > -0.5f)  // ATen's is_lerp_weight_small
    moments<kFused, true>(m, v, g, n, c);
  else
    moments<kFused, false>(m, v, g, n, c);
}

GMOD_FMA_TARGET void moments_fused(float* m, float* v, const float* g, int64_t n, const AdamWCpuCoeffs& c) {
  moments_dispatch<true>(m, v, g, n, c);
}

void moments_plain(float* m, float* v, const float* g, int64_t n, const AdamWCpuCoeffs& c) {
  moments_dispatch<false>(m, v, g, n, c);
}

// No multiply-add to fuse here: the AVX2 variant is only faster (chosen when ATen's is, i.e. the CPU has
// AVX2).
GMOD_FMA_TARGET void apply_avx2(float* p, const float* m, const float* s, int64_t n, bool decay,
                                const AdamWCpuCoeffs& c) {
  decay ? apply<true>(p, m, s, n, c) : apply<false>(p, m, s, n, c);
}

void apply_plain(float* p, const float* m, const float* s, int64_t n, bool decay, const AdamWCpuCoeffs& c) {
  decay ? apply<true>(p, m, s, n, c) : apply<false>(p, m, s, n, c);
}

// Elements per block: the four arrays and the sqrt scratch stay in L2 between the passes (5 x 64 KiB).
constexpr int64_t kBlock = int64_t(1) << 14;

// One block [0, n <= kBlock): moments, ATen's sqrt into `scratch`, then the parameter update of each run (block
// coordinates, clipped by the caller) with its group's coefficients.
void block(float* p, float* m, float* v, const float* g, float* scratch, int64_t n,
           const std::vector<AdamWCpuRun>& runs, const std::vector<AdamWCpuCoeffs>& coeffs) {
  const AdamWCpuCoeffs& c = coeffs.front();
  c.fused ? moments_fused(m, v, g, n, c) : moments_plain(m, v, g, n, c);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  at::Tensor out = at::from_blob(scratch, {n}, f32);
  at::sqrt_out(out, at::from_blob(v, {n}, f32));
  for (const AdamWCpuRun& r : runs) {
    const AdamWCpuCoeffs& rc = coeffs[size_t(r.coeffs)];
    if (r.begin < r.end)
      c.fused ? apply_avx2(p + r.begin, m + r.begin, scratch + r.begin, r.end - r.begin, r.decay, rc)
              : apply_plain(p + r.begin, m + r.begin, scratch + r.begin, r.end - r.begin, r.decay, rc);
  }
}

// [b, e) of the arrays, block by block; runs in the arrays' coordinates (sorted, disjoint, covering [b, e)).
void update_range(float* p, float* m, float* v, const float* g, int64_t b, int64_t e,
                  const std::vector<AdamWCpuRun>& runs, const std::vector<AdamWCpuCoeffs>& coeffs) {
  std::vector<float> scratch(size_t(std::min(kBlock, e - b)));
  std::vector<AdamWCpuRun> local;
  auto it = std::upper_bound(runs.begin(), runs.end(), b, [](int64_t x, const AdamWCpuRun& r) { return x < r.end; });
  for (int64_t i = b; i < e; i += kBlock) {
    const int64_t j = std::min(e, i + kBlock);
    local.clear();
    while (it != runs.end() && it->end <= i) ++it;
    for (auto k = it; k != runs.end() && k->begin < j; ++k)
      local.push_back({std::max(k->begin, i) - i, std::min(k->end, j) - i, k->coeffs, k->decay});
    block(p + i, m + i, v + i, g + i, scratch.data(), j - i, local, coeffs);
  }
}

// Decay ranges (sorted, disjoint) as runs covering [0, n) with one set of coefficients.
std::vector<AdamWCpuRun> decay_runs(int64_t n, const std::vector<std::pair<int64_t, int64_t>>& decay) {
  std::vector<AdamWCpuRun> runs;
  int64_t i = 0;
  for (const auto& [lo, hi] : decay) {
    if (i < lo) runs.push_back({i, lo, 0, false});
    if (lo < hi) runs.push_back({lo, hi, 0, true});
    i = hi;
  }
  if (i < n) runs.push_back({i, n, 0, false});
  return runs;
}

void check(const at::Tensor& t, int64_t n, const char* what) {
  if (!t.defined() || !t.device().is_cpu() || t.scalar_type() != at::kFloat || !t.is_contiguous() ||
      t.numel() != n)
    throw std::runtime_error(std::string("parallel/adamw_cpu: ") + what +
                             " must be a contiguous fp32 CPU tensor of " + std::to_string(n) + " elements");
}

}  // namespace

AdamWCpuCoeffs adamw_cpu_coeffs(double lr, double beta1, double beta2, double eps, double weight_decay,
                                double bias_correction1, double bias_correction2_sqrt) {
  AdamWCpuCoeffs c;
  c.decay_factor = float(1.0 - lr * weight_decay);
  c.lerp_weight = float(1.0 - beta1);
  c.beta2 = float(beta2);
  c.one_minus_beta2 = float(1.0 - beta2);
  c.bias_correction2_sqrt = float(bias_correction2_sqrt);
  c.eps = float(eps);
  c.neg_step_size = float(-(lr / bias_correction1));
  c.fused = adamw_cpu_aten_fuses();
  return c;
}

bool adamw_cpu_aten_fuses() {
  // Asked of ATen itself rather than of its CPU-capability enum: lerp_ and addcmul_ on values where a fused
  // and an unfused product round differently (about 10% and 0.3% of random ones), with a vector tail.
  static const bool fused = [] {
    c10::NoGradGuard no_grad;
    const int64_t n = (1 << 14) + 7;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(20240607);  // leaves the global generator alone
    const auto f32 = at::TensorOptions().dtype(at::kFloat);
    at::Tensor g = at::randn({n}, gen, f32), m = at::randn({n}, gen, f32), v = at::rand({n}, gen, f32);
    const float w = 0.1f, c2 = float(1.0 - 0.999);
    at::Tensor lerp = m.clone().lerp_(g, w);
    at::Tensor addcmul = v.clone().addcmul_(g, g, 1.0 - 0.999);
    bool lerp_fused = true, lerp_plain = true, acm_fused = true, acm_plain = true;
    const float *pg = g.data_ptr<float>(), *pm = m.data_ptr<float>(), *pv = v.data_ptr<float>();
    const float *pl = lerp.data_ptr<float>(), *pa = addcmul.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) {
      const float d = pg[i] - pm[i], cg = c2 * pg[i];
      const float prod = w * d, prod2 = cg * pg[i];  // rounded: -ffp-contract=off
      lerp_fused &= pl[i] == __builtin_fmaf(w, d, pm[i]);
      lerp_plain &= pl[i] == pm[i] + prod;
      acm_fused &= pa[i] == __builtin_fmaf(cg, pg[i], pv[i]);
      acm_plain &= pa[i] == pv[i] + prod2;
    }
    if (lerp_fused && acm_fused) return true;
    if (lerp_plain && acm_plain) return false;
    throw std::runtime_error(
        "parallel/adamw_cpu: this LibTorch's CPU lerp_/addcmul_ round neither like fused nor like unfused "
        "multiply-adds (mixed); the offloaded AdamW cannot reproduce them bitwise. Report it with the output "
        "of "
        "torch.__config__.show()");
  }();
  return fused;
}

void adamw_cpu_kernel(float* p, float* m, float* v, const float* g, int64_t n, bool decay,
                      const AdamWCpuCoeffs& c) {
  if (n <= 0) return;
  update_range(p, m, v, g, 0, n, {AdamWCpuRun{0, n, 0, decay}}, {c});
}

void adamw_cpu_update(at::Tensor& master, at::Tensor& exp_avg, at::Tensor& exp_avg_sq, const at::Tensor& grad,
                      const std::vector<std::pair<int64_t, int64_t>>& decay, const AdamWCpuCoeffs& c) {
  adamw_cpu_update(master, exp_avg, exp_avg_sq, grad, decay_runs(master.numel(), decay), {c});
}

void adamw_cpu_update(at::Tensor& master, at::Tensor& exp_avg, at::Tensor& exp_avg_sq, const at::Tensor& grad,
                      const std::vector<AdamWCpuRun>& runs, const std::vector<AdamWCpuCoeffs>& coeffs) {
  const int64_t n = master.numel();
  check(master, n, "master");
  check(exp_avg, n, "exp_avg");
  check(exp_avg_sq, n, "exp_avg_sq");
  check(grad, n, "grad");
  if (coeffs.empty()) throw std::runtime_error("parallel/adamw_cpu: no coefficients");
  int64_t covered = 0;
  for (const AdamWCpuRun& r : runs) {
    if (r.begin != covered || r.end < r.begin || r.coeffs < 0 || r.coeffs >= int(coeffs.size()))
      throw std::runtime_error("parallel/adamw_cpu: runs must be sorted, disjoint, cover [0, " + std::to_string(n) +
                               ") and name one of " + std::to_string(coeffs.size()) + " coefficient sets");
    covered = r.end;
  }
  if (covered != n)
    throw std::runtime_error("parallel/adamw_cpu: runs cover [0, " + std::to_string(covered) + ") of [0, " +
                             std::to_string(n) + ")");
  float *p = master.data_ptr<float>(), *m = exp_avg.data_ptr<float>(), *v = exp_avg_sq.data_ptr<float>();
  const float* g = grad.data_ptr<float>();
  // 64 Ki elements (1 MiB over the four arrays) per task: large enough to amortise the dispatch, small enough
  // to spread a shard over every thread. ATen calls inside a task (the sqrt) run on the task's thread.
  at::parallel_for(0, n, int64_t(1) << 16,
                   [&](int64_t b, int64_t e) { update_range(p, m, v, g, b, e, runs, coeffs); });
}

}  // namespace gmod

// accumulate_fp32: bf16 parameters, 8 micro-batches. The reference is the exact (fp64) sum of the same bf16
// per-micro-batch gradients; accumulating in an fp32 buffer stays close to it, accumulating in the bf16 .grad does
// not. Also: hooks leave .grad attached and zero, and step() still works (LocalComm, single process).
#include "parallel/data_parallel.h"
#include "parallel/local_comm.h"
#include "tests/parallel/parallel_test_util.h"

#include <gtest/gtest.h>

using namespace gmod;
using namespace gmod::testing;

namespace {

constexpr int kMicro = 8;

void micro_backward(const Mlp& m, int i) {
  at::manual_seed(500 + i);
  at::Tensor x = at::randn({16, 4}), y = at::randn({16, 3});
  (m.loss(x, y) / kMicro).backward();
}

at::Tensor flat_grad(const Mlp& m) {
  std::vector<at::Tensor> v;
  for (const auto& t : m.tensors()) v.push_back(t.grad().reshape({-1}).to(at::kDouble));
  return at::cat(v);
}

}  // namespace

TEST(AccumulateFp32, Bf16ParamsCloserToExactSum) {
  // Exact sum of the bf16 per-micro-batch gradients.
  Mlp ref = Mlp::make(3, at::kBFloat16);
  at::Tensor exact = at::zeros({Mlp::kParams}, at::kDouble);
  for (int i = 0; i < kMicro; ++i) {
    zero_grads(ref);
    micro_backward(ref, i);
    exact += flat_grad(ref);
  }
  double err[2];
  for (bool acc32 : {false, true}) {
    Mlp m = Mlp::make(3, at::kBFloat16);
    DataParallelOptions o;
    o.accumulate_fp32 = acc32;
    DataParallelOptimizer opt(m.named(), std::make_shared<LocalComm>(), o);
    opt.zero_grad();
    for (int i = 0; i < kMicro; ++i) {
      if (i == kMicro - 1) opt.set_last_micro_batch();
      micro_backward(m, i);
    }
    if (acc32) {
      EXPECT_EQ(m.w1.grad().abs().max().item<float>(), 0.f) << "hooks reset the bf16 grad";
    }
    opt.reduce_gradients();
    at::Tensor g = opt.reduced_gradient().narrow(0, 0, Mlp::kParams).to(at::kDouble);
    err[acc32] = (g - exact).abs().max().item<double>() / exact.abs().max().item<double>();
    StepResult r = opt.step(1e-3);
    EXPECT_FALSE(r.skipped);
    EXPECT_TRUE(at::isfinite(m.flat()).all().item<bool>());
  }
  std::printf("relative error vs exact sum: bf16 accumulation %.3g, fp32 accumulation %.3g\n", err[0], err[1]);
  EXPECT_LT(err[1], 1e-6);
  EXPECT_GT(err[0], 30 * err[1]);
}

TEST(AccumulateFp32, Fp32ParamsUnaffected) {
  Mlp a = Mlp::make(4), b = Mlp::make(4);
  DataParallelOptions o;
  o.accumulate_fp32 = true;
  DataParallelOptimizer oa(a.named(), std::make_shared<LocalComm>(), o);
  o.accumulate_fp32 = false;
  DataParallelOptimizer ob(b.named(), std::make_shared<LocalComm>(), o);
  for (int step = 0; step < 3; ++step) {
    oa.zero_grad();
    ob.zero_grad();
    for (int i = 0; i < kMicro; ++i) micro_backward(a, i), micro_backward(b, i);
    oa.step(1e-2);
    ob.step(1e-2);
  }
  EXPECT_TRUE(a.flat().equal(b.flat()));
}

// Optimizer offload's CPU AdamW (parallel/adamw_cpu.h) against the ATen sequence of the device-resident
// ShardedAdamW (the oracle: torch.optim.AdamW's single-tensor formulas as ATen ops): bitwise the same master
// and moments after several steps, for shards whose length leaves vector tails, with and without weight decay
// on part of the range, a small and a large lerp weight (beta1 0.9 and 0.2), one and several threads, and a
// checkpoint moved between the two. On a CUDA device (skipped without one): the offloaded state is pinned
// host memory, a device gradient is copied in, and the bf16 device parameters it writes back are the CPU
// result rounded.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "parallel/adamw_cpu.h"
#include "parallel/sharded_adamw.h"

using namespace gmod;

namespace {

bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() &&
         a.cpu().view(at::kInt).equal(b.cpu().view(at::kInt));  // bits, NaN included
}

// Runs `steps` updates of both optimizers over the range [begin, begin + n) with the same gradients (varying
// in scale so some steps would be clipped upstream) and checks every state tensor bitwise after each step.
void run_pair(int64_t begin, int64_t n, AdamWHyper h, const std::vector<std::pair<int64_t, int64_t>>& decay,
              int steps, uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor master0 = at::randn({n});
  AdamWHyper off = h;
  off.offload = true;
  ShardedAdamW ref(begin, begin + n, master0, h), cpu(begin, begin + n, master0, off);
  if (!decay.empty()) {
    ref.set_decay_ranges(decay);
    cpu.set_decay_ranges(decay);
  }
  for (int s = 0; s < steps; ++s) {
    at::Tensor g = at::randn({n}) * (s % 2 ? 1e-3 : 3.0);
    if (n > 3) g[n / 3] = 0.f;  // a zero gradient: v stays, the update is m's alone
    const double lr = 1e-2 / (s + 1);
    ref.step(g, lr);
    cpu.step(g, lr);
    ASSERT_TRUE(same(cpu.master(), ref.master())) << "master differs at step " << s << ", n " << n;
    ASSERT_TRUE(same(cpu.exp_avg(), ref.exp_avg())) << "exp_avg differs at step " << s << ", n " << n;
    ASSERT_TRUE(same(cpu.exp_avg_sq(), ref.exp_avg_sq()))
        << "exp_avg_sq differs at step " << s << ", n " << n;
  }
  EXPECT_EQ(cpu.step_count(), steps);
}

}  // namespace

TEST(AdamWOffload, BitwiseEqualsAtenUpdate) {
  AdamWHyper h;
  h.weight_decay = 0.1;
  for (int64_t n : {1, 7, 16, 33, 1000, 70001}) {
    // Decay on two pieces of the range (a bias-like hole and the tail excluded), in flat coordinates.
    const int64_t b = 5;
    std::vector<std::pair<int64_t, int64_t>> decay = {{b, b + n / 2}, {b + n / 2 + n / 5 + 1, b + n - n / 7}};
    run_pair(b, n, h, decay, 5, 100 + uint64_t(n));
    run_pair(0, n, h, {}, 3, 200 + uint64_t(n));
  }
}

TEST(AdamWOffload, LargeLerpWeightAndNoDecay) {
  AdamWHyper h;
  h.beta1 = 0.2;  // lerp weight 0.8: ATen's other branch, end - (end - self)(1 - w)
  h.beta2 = 0.95;
  h.eps = 1e-6;
  run_pair(0, 4099, h, {}, 4, 7);
}

TEST(AdamWOffload, SeveralThreadsGiveTheSameBits) {
  const int before = at::get_num_threads();
  at::set_num_threads(3);
  AdamWHyper h;
  h.weight_decay = 0.01;
  const int64_t n = (int64_t(1) << 18) + 11;  // several 64 Ki-element tasks
  run_pair(3, n, h, {{3, n / 2}, {n / 2 + 100, n + 3}}, 3, 11);
  at::set_num_threads(before);
}

// The kernel over a whole array equals the kernel run element by element (the vector body against the scalar
// remainder loop, which handles one element at a time).
TEST(AdamWOffload, VectorBodyEqualsScalarRemainder) {
  at::manual_seed(3);
  const int64_t n = 999;
  at::Tensor p = at::randn({n}), m = at::randn({n}), v = at::rand({n}), g = at::randn({n});
  at::Tensor p1 = p.clone(), m1 = m.clone(), v1 = v.clone();
  const AdamWCpuCoeffs c = adamw_cpu_coeffs(1e-2, 0.9, 0.999, 1e-8, 0.1, 0.19, 0.0447);
  adamw_cpu_kernel(p.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), g.data_ptr<float>(), n,
                   true, c);
  for (int64_t i = 0; i < n; ++i)
    adamw_cpu_kernel(p1.data_ptr<float>() + i, m1.data_ptr<float>() + i, v1.data_ptr<float>() + i,
                     g.data_ptr<float>() + i, 1, true, c);
  EXPECT_TRUE(same(p, p1));
  EXPECT_TRUE(same(m, m1));
  EXPECT_TRUE(same(v, v1));
}

// The checkpointed state is the same tensors either way: a state saved with offload loads without it and the
// reverse, and both continue bitwise like an uninterrupted run.
TEST(AdamWOffload, CheckpointsMoveBetweenOffloadAndDevice) {
  at::manual_seed(5);
  const int64_t n = 513;
  at::Tensor master0 = at::randn({n});
  std::vector<at::Tensor> grads;
  for (int s = 0; s < 6; ++s) grads.push_back(at::randn({n}));
  AdamWHyper h, off;
  h.weight_decay = off.weight_decay = 0.05;
  off.offload = true;
  ShardedAdamW straight(0, n, master0, h);
  for (int s = 0; s < 6; ++s) straight.step(grads[size_t(s)], 1e-2);
  for (bool first_offloaded : {true, false}) {
    ShardedAdamW a(0, n, master0, first_offloaded ? off : h);
    for (int s = 0; s < 3; ++s) a.step(grads[size_t(s)], 1e-2);
    AdamWShardState st;
    st.begin = 0;
    st.end = n;
    st.step = a.step_count();
    st.master = a.master().clone();
    st.exp_avg = a.exp_avg().clone();
    st.exp_avg_sq = a.exp_avg_sq().clone();
    ShardedAdamW b(0, n, at::zeros({n}), first_offloaded ? h : off);
    b.load(st);
    for (int s = 3; s < 6; ++s) b.step(grads[size_t(s)], 1e-2);
    EXPECT_TRUE(same(b.master(), straight.master())) << "first offloaded: " << first_offloaded;
    EXPECT_TRUE(same(b.exp_avg_sq(), straight.exp_avg_sq())) << "first offloaded: " << first_offloaded;
  }
}

TEST(AdamWOffload, HostBytesAreTheState) {
  AdamWHyper off;
  off.offload = true;
  ShardedAdamW a(0, 100, at::zeros({100}), off), b(0, 100, at::zeros({100}), AdamWHyper{});
  EXPECT_TRUE(a.offloaded());
  EXPECT_EQ(a.host_bytes(), 1200);  // CPU gradient: used in place, no host copy
  EXPECT_EQ(b.host_bytes(), 0);
  at::Tensor dst = at::empty({100}, at::TensorOptions().dtype(at::kBFloat16));
  a.copy_master_to(dst);
  EXPECT_TRUE(dst.equal(a.master().to(at::kBFloat16)));
  EXPECT_THROW(a.copy_master_to(at::empty({99})), std::runtime_error);
}

TEST(OffloadCuda, PinnedStateDeviceGradientAndBf16WriteBack) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  at::manual_seed(9);
  const int64_t n = 40000;
  at::Tensor master0 = at::randn({n});
  AdamWHyper h, off;
  h.weight_decay = off.weight_decay = 0.1;
  off.offload = true;
  ShardedAdamW ref(0, n, master0, h), dev(0, n, master0.cuda(), off);
  EXPECT_TRUE(dev.master().device().is_cpu());
  EXPECT_TRUE(dev.master().is_pinned());
  EXPECT_TRUE(dev.exp_avg_sq().is_pinned());
  for (int s = 0; s < 4; ++s) {
    at::Tensor g = at::randn({n});
    ref.step(g, 1e-2);
    dev.step(g.cuda(), 1e-2);
  }
  EXPECT_TRUE(same(dev.master(), ref.master()));
  EXPECT_TRUE(same(dev.exp_avg(), ref.exp_avg()));
  EXPECT_EQ(dev.host_bytes(), 16 * n);  // state + the host copy of the gradient
  at::Tensor params = at::empty({n}, at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA));
  dev.copy_master_to(params);
  EXPECT_TRUE(params.cpu().equal(ref.master().to(at::kBFloat16)));
}

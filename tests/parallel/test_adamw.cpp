// ShardedAdamW against hand-written per-element AdamW formulas (double precision), and DataParallelOptimizer on a
// one-process LocalComm against the whole-tensor reference for stages 0/1/2, accumulation, clipping and state I/O.
#include "parallel/data_parallel.h"
#include "parallel/local_comm.h"
#include "parallel/sharded_adamw.h"
#include "tests/parallel/parallel_test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>

using namespace gmod;
using namespace gmod::testing;

TEST(ShardedAdamW, MatchesHandWrittenFormula) {
  const int64_t n = 37;
  AdamWHyper h{0.85, 0.99, 1e-6, 0.1};
  at::manual_seed(3);
  at::Tensor p0 = at::randn({n});
  ShardedAdamW opt(10, 10 + n, p0, h);
  EXPECT_EQ(opt.state_bytes(), 12 * n);
  std::vector<double> p(n), m(n, 0), v(n, 0);
  for (int64_t i = 0; i < n; ++i) p[i] = p0[i].item<float>();
  for (int t = 1; t <= 6; ++t) {
    const double lr = 0.01 * t;
    at::Tensor g = at::randn({n}) * (t == 3 ? 1e-4 : 1.0);
    opt.step(g, lr);
    for (int64_t i = 0; i < n; ++i) {
      const double gi = g[i].item<float>();
      p[i] *= 1 - lr * h.weight_decay;
      m[i] = h.beta1 * m[i] + (1 - h.beta1) * gi;
      v[i] = h.beta2 * v[i] + (1 - h.beta2) * gi * gi;
      const double mhat = m[i] / (1 - std::pow(h.beta1, t)), vhat = v[i] / (1 - std::pow(h.beta2, t));
      p[i] -= lr * mhat / (std::sqrt(vhat) + h.eps);
    }
  }
  EXPECT_EQ(opt.step_count(), 6);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(opt.master()[i].item<float>(), p[i], 1e-5 * std::max(1.0, std::abs(p[i]))) << i;
    EXPECT_NEAR(opt.exp_avg()[i].item<float>(), m[i], 1e-6);
    EXPECT_NEAR(opt.exp_avg_sq()[i].item<float>(), v[i], 1e-6);
  }
}

// Two parameter groups as in torch.optim.AdamW([{"params": decayed, "weight_decay": wd}, {"params": rest,
// "weight_decay": 0}]): elements outside the decay ranges follow the same formulas without the decay factor.
TEST(ShardedAdamW, DecayOnlyInsideDecayRanges) {
  const int64_t n = 37, b0 = 10;
  AdamWHyper h{0.9, 0.999, 1e-8, 0.3};
  at::manual_seed(4);
  at::Tensor p0 = at::randn({n});
  ShardedAdamW opt(b0, b0 + n, p0, h);
  EXPECT_EQ(opt.decay_ranges(), (std::vector<std::pair<int64_t, int64_t>>{{b0, b0 + n}})) << "default: all";
  // Ranges in flat coordinates, partly outside [10, 47); adjacent ones merge.
  opt.set_decay_ranges({{0, 15}, {20, 25}, {25, 30}, {45, 60}});
  EXPECT_EQ(opt.decay_ranges(), (std::vector<std::pair<int64_t, int64_t>>{{10, 15}, {20, 30}, {45, 47}}));
  EXPECT_THROW(opt.set_decay_ranges({{20, 30}, {25, 35}}), std::runtime_error);
  auto decayed = [&](int64_t i) {
    const int64_t f = b0 + i;
    return f < 15 || (f >= 20 && f < 30) || f >= 45;
  };
  std::vector<double> p(n), m(n, 0), v(n, 0);
  for (int64_t i = 0; i < n; ++i) p[i] = p0[i].item<float>();
  for (int t = 1; t <= 4; ++t) {
    const double lr = 0.05;
    at::Tensor g = at::randn({n});
    opt.step(g, lr);
    for (int64_t i = 0; i < n; ++i) {
      const double gi = g[i].item<float>();
      if (decayed(i)) p[i] *= 1 - lr * h.weight_decay;
      m[i] = h.beta1 * m[i] + (1 - h.beta1) * gi;
      v[i] = h.beta2 * v[i] + (1 - h.beta2) * gi * gi;
      const double mhat = m[i] / (1 - std::pow(h.beta1, t)), vhat = v[i] / (1 - std::pow(h.beta2, t));
      p[i] -= lr * mhat / (std::sqrt(vhat) + h.eps);
    }
  }
  int differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(opt.master()[i].item<float>(), p[i], 1e-5 * std::max(1.0, std::abs(p[i]))) << i;
    // The decay factor is visible: 4 steps of 1.5% shrink differ from no decay by far more than the tolerance.
    const double undecayed_shift = std::abs(p[i]) * (1 - std::pow(1 - 0.05 * 0.3, 4));
    differ += decayed(i) && undecayed_shift > 1e-3;
  }
  EXPECT_GT(differ, 5);
}

TEST(DataParallelOptimizer, LocalMatchesReferenceAllStages) {
  for (int stage : {0, 1, 2}) {
    DataParallelOptions o;
    o.stage = stage;
    o.weight_decay = 0.05;
    o.max_grad_norm = 0.5;
    o.bucket_bytes = 40;  // many buckets
    Mlp dp = Mlp::make(7), ref = Mlp::make(7);
    DataParallelOptimizer opt(dp.named(), std::make_shared<LocalComm>(), o);
    EXPECT_EQ(opt.optimizer_state_bytes(), 12 * Mlp::kParams);
    RefAdamW r{AdamWHyper{o.beta1, o.beta2, o.eps, o.weight_decay}, o.max_grad_norm};
    int clipped = 0;
    for (int step = 0; step < 5; ++step) {
      opt.zero_grad();
      zero_grads(ref);
      local_backward(dp, step, 0, 1, /*micro=*/3 - (step % 2));  // 2 or 3 accumulated micro-batches
      local_backward(ref, step, 0, 1, 1);
      StepResult s = opt.step(1e-2);
      auto [norm, cl] = r.update(ref.tensors(), 1e-2);
      EXPECT_NEAR(s.grad_norm, norm, 1e-6 * norm);
      EXPECT_EQ(s.clipped, cl);
      EXPECT_FALSE(s.skipped);
      clipped += cl;
    }
    EXPECT_GT(clipped, 0);
    EXPECT_LT(rel_diff(dp.flat(), ref.flat()), 1e-6) << "stage " << stage;
    EXPECT_EQ(opt.step_count(), 5);
  }
}

TEST(DataParallelOptimizer, ReplacedGradsAreTakenAndStateRoundTrips) {
  Mlp a = Mlp::make(1), b = Mlp::make(1);
  DataParallelOptions o;
  o.stage = 1;
  DataParallelOptimizer oa(a.named(), std::make_shared<LocalComm>(), o);
  RefAdamW r{AdamWHyper{}, 0};
  local_backward(b, 0, 0, 1, 1);
  // A trainer that drops our grad views (set_to_none) and back-propagates again: new grads are picked up.
  for (auto t : a.tensors()) t.mutable_grad() = at::Tensor();
  local_backward(a, 0, 0, 1, 1);
  oa.step(1e-2);
  r.update(b.tensors(), 1e-2);
  EXPECT_LT(rel_diff(a.flat(), b.flat()), 1e-6);

  AdamWShardState s = oa.state_dict();
  AdamWShardState back = AdamWShardState::from_meta(nlohmann::json::parse(s.meta().dump()));
  back.master = s.master.clone();
  back.exp_avg = s.exp_avg.clone();
  back.exp_avg_sq = s.exp_avg_sq.clone();
  Mlp c = Mlp::make(99);  // different weights: loading must overwrite them from the master
  DataParallelOptimizer oc(c.named(), std::make_shared<LocalComm>(), o);
  oc.load_state_dict(back);
  EXPECT_TRUE(c.flat().equal(a.flat()));
  EXPECT_EQ(oc.step_count(), 1);
  oa.zero_grad();
  oc.zero_grad();
  for (Mlp* m : {&a, &c}) local_backward(*m, 1, 0, 1, 1);
  oa.step(1e-2);
  oc.step(1e-2);
  EXPECT_TRUE(c.flat().equal(a.flat()));

  back.begin += 1;
  EXPECT_THROW(oc.load_state_dict(back), std::runtime_error);
}

TEST(DataParallelOptimizer, RejectsBadParams) {
  DataParallelOptions o;
  auto comm = std::make_shared<LocalComm>();
  at::Tensor frozen = at::zeros({3});
  EXPECT_THROW(DataParallelOptimizer({{"f", frozen}}, comm, o), std::runtime_error);
  at::Tensor a = at::zeros({3}).requires_grad_(), b = at::zeros({3}, at::kDouble).requires_grad_();
  EXPECT_THROW(DataParallelOptimizer({{"a", a}, {"b", b}}, comm, o), std::runtime_error);
  EXPECT_THROW(DataParallelOptimizer({{"a", a}, {"a2", a}}, comm, o), std::runtime_error);
  o.stage = 3;
  EXPECT_THROW(DataParallelOptimizer({{"a", a}}, comm, o), std::runtime_error);
}

TEST(DataParallelOptimizer, NonFiniteSkips) {
  for (int stage : {0, 2}) {
    Mlp a = Mlp::make(2);
    DataParallelOptions o;
    o.stage = stage;
    DataParallelOptimizer opt(a.named(), std::make_shared<LocalComm>(), o);
    local_backward(a, 0, 0, 1, 1);
    at::Tensor before = a.flat();
    c10::NoGradGuard ng;
    a.w2.mutable_grad()[1][2] = std::numeric_limits<float>::infinity();
    StepResult s = opt.step(1e-2);
    EXPECT_TRUE(s.skipped);
    EXPECT_TRUE(a.flat().equal(before));
    EXPECT_EQ(opt.skipped_steps(), 1);
    EXPECT_EQ(opt.step_count(), 0);
  }
}

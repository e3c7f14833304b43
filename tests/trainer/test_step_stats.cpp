// StepStats (trainer/step_stats.h): a step's counts go through exactly one all-reduce of one packed vector, in the
// documented order, and come back as the sums with every per-MoD-layer entry in its place.
#include <gtest/gtest.h>

#include "trainer/step_stats.h"

namespace gmod {
namespace {

StepStats sample_stats() {
  StepStats s(2, at::TensorOptions().dtype(at::kDouble));
  s.lm_loss_sum += 12.5;
  s.routing_loss_sum += 0.25;
  s.tokens = 300;
  s.samples = 4;
  s.padded_tokens = 320;
  s.stop = true;
  s.flops = TrainFlops{1e9, 2e9};
  s.processed = {100, 60};
  s.entered = {200, 200};
  s.routable = {150, 120};
  return s;
}

TEST(StepStats, OneAllReduceOfThePackedVectorInItsOrder) {
  const StepStats s = sample_stats();
  int calls = 0;
  at::Tensor seen;
  // Two ranks with the same counts: the sum doubles every entry.
  const StepTotals t = reduce_step_stats(s, at::kCPU, [&](at::Tensor& packed) {
    ++calls;
    seen = packed.clone();
    packed.mul_(2);
  });
  EXPECT_EQ(calls, 1);
  ASSERT_EQ(seen.numel(), 8 + 3 * 2);
  const std::vector<double> expected = {12.5, 0.25, 300, 4, 1, 100, 60, 200, 200, 320, 1e9, 2e9, 150, 120};
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(seen[int64_t(i)].item<double>(), expected[i]) << i;

  EXPECT_EQ(t.lm_loss_sum, 25.0);
  EXPECT_EQ(t.routing_loss_sum, 0.5);
  EXPECT_EQ(t.tokens, 600);
  EXPECT_EQ(t.samples, 8);
  EXPECT_EQ(t.padded_tokens, 640);
  EXPECT_TRUE(t.stop);
  EXPECT_EQ(t.flops.flops, 2e9);
  EXPECT_EQ(t.flops.dense_flops, 4e9);
  EXPECT_EQ(t.processed, (std::vector<double>{200, 120}));
  EXPECT_EQ(t.entered, (std::vector<double>{400, 400}));
  EXPECT_EQ(t.routable, (std::vector<double>{300, 240}));

  std::map<int, double> of_entered, of_routable;
  t.skip_ratios({3, 7}, of_entered, of_routable);
  EXPECT_DOUBLE_EQ(of_entered.at(3), 0.5);
  EXPECT_DOUBLE_EQ(of_entered.at(7), 0.7);
  EXPECT_DOUBLE_EQ(of_routable.at(3), 200.0 / 300.0);
  EXPECT_DOUBLE_EQ(of_routable.at(7), 280.0 / 240.0);
}

TEST(StepStats, NoStopNoModLayersAndLayersWithoutTokens) {
  StepStats s(1, at::TensorOptions().dtype(at::kDouble));
  const StepTotals t = reduce_step_stats(s, at::kCPU, [](at::Tensor&) {});
  EXPECT_FALSE(t.stop);
  std::map<int, double> of_entered, of_routable;
  t.skip_ratios({5}, of_entered, of_routable);
  EXPECT_TRUE(of_entered.empty());  // no token entered layer 5: no ratio rather than 0/0
  EXPECT_TRUE(of_routable.empty());

  StepStats none(0, at::TensorOptions().dtype(at::kDouble));
  int64_t size = -1;
  reduce_step_stats(none, at::kCPU, [&](at::Tensor& p) { size = p.numel(); });
  EXPECT_EQ(size, 8);
}

}  // namespace
}  // namespace gmod

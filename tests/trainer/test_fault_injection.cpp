// GMOD_FAULT_INJECT's grammar (trainer/fault_injection.h): what fires where, and a named error for each bad
// spec.
#include <gtest/gtest.h>

#include <cmath>

#include "trainer/fault_injection.h"

using gmod::FaultInjection;

namespace {

std::string error_of(const std::string& spec) {
  try {
    FaultInjection::parse(spec);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(FaultInjection, ParsesStepsRanksAndCounts) {
  EXPECT_TRUE(FaultInjection::parse("").empty());
  auto f = FaultInjection::parse("nonfinite_grad:step=3,rank=1; nonfinite_grad:rank=0,step=5,count=2");
  ASSERT_EQ(f.faults.size(), 2u);
  EXPECT_TRUE(f.nonfinite_grad_due(3, 1));
  EXPECT_FALSE(f.nonfinite_grad_due(3, 0));
  EXPECT_FALSE(f.nonfinite_grad_due(2, 1));
  EXPECT_FALSE(f.nonfinite_grad_due(4, 1));
  EXPECT_TRUE(f.nonfinite_grad_due(5, 0));
  EXPECT_TRUE(f.nonfinite_grad_due(6, 0));
  EXPECT_FALSE(f.nonfinite_grad_due(7, 0));
  EXPECT_EQ(f.describe(), "nonfinite_grad on rank 1 at step 3; nonfinite_grad on rank 0 at step 5..6");
}

TEST(FaultInjection, SlowArankParsesRankAndSeconds) {
  auto f = FaultInjection::parse("slow_arank:rank=0,seconds=8; nonfinite_grad:step=2,rank=1");
  ASSERT_EQ(f.faults.size(), 2u);
  EXPECT_EQ(f.slow_arank_seconds(0), 8);
  EXPECT_EQ(f.slow_arank_seconds(1), 0);
  EXPECT_TRUE(f.nonfinite_grad_due(2, 1));
  EXPECT_FALSE(f.nonfinite_grad_due(2, 0));
  EXPECT_EQ(f.describe(), "slow_arank on rank 0: +8 s; nonfinite_grad on rank 1 at step 2");
  const std::pair<const char*, const char*> bad[] = {
      {"slow_arank", "needs rank= and seconds="},
      {"slow_arank:rank=0", "needs seconds="},
      {"slow_arank:seconds=3", "needs rank="},
      {"slow_arank:rank=0,seconds=0", "seconds must be in [1, 86400]"},
      {"slow_arank:rank=0,seconds=3,step=2", "unknown key 'step' for slow_arank (known: rank, seconds)"},
  };
  for (const auto& [spec, want] : bad) {
    const std::string err = error_of(spec);
    EXPECT_NE(err.find(want), std::string::npos) << spec << " -> " << err;
  }
}

TEST(FaultInjection, BadSpecsAreNamedErrors) {
  const std::pair<const char*, const char*> cases[] = {
      {"nan_loss:step=1,rank=0", "unknown fault kind 'nan_loss'"},
      {"nonfinite_grad", "needs step= and rank="},
      {"nonfinite_grad:step=2", "needs rank="},
      {"nonfinite_grad:rank=2", "needs step="},
      {"nonfinite_grad:step=0,rank=0", "step must be >= 1"},
      {"nonfinite_grad:step=-1,rank=0", "step='-1' is not a non-negative decimal integer"},
      {"nonfinite_grad:step=3,rank=1x", "rank='1x' is not"},
      {"nonfinite_grad:step=3,rank=1,count=0", "count must be >= 1"},
      {"nonfinite_grad:step=3,rank=1,when=now", "unknown key 'when'"},
      {"nonfinite_grad:step=3,step=4,rank=1", "step given twice"},
      {"nonfinite_grad:step=3,rank=1;", "empty fault"},
      {"nonfinite_grad:step3,rank=1", "'step3' is not key=value"},
  };
  for (const auto& [spec, want] : cases) {
    const std::string err = error_of(spec);
    EXPECT_NE(err.find(want), std::string::npos) << spec << " -> " << err;
    EXPECT_NE(err.find(std::string("GMOD_FAULT_INJECT='") + spec + "'"), std::string::npos) << err;
  }
}

TEST(FaultInjection, UnsetVariableLeavesTheLossAlone) {
  // The test binary runs without GMOD_FAULT_INJECT (ctest sets none): the hook is the identity.
  ASSERT_EQ(std::getenv(FaultInjection::kEnv), nullptr);
  at::Tensor loss = at::full({}, 2.5);
  EXPECT_EQ(gmod::inject_faults_into_loss(loss, 1, 0).item<double>(), 2.5);
}

TEST(FaultInjection, SlowSaveFiresOnItsRankAtItsStepOrEverySave) {
  auto f = FaultInjection::parse("slow_save:rank=2,seconds=60,step=4; slow_save:rank=1,seconds=5");
  ASSERT_EQ(f.faults.size(), 2u);
  EXPECT_EQ(f.slow_save_seconds(4, 2), 60);
  EXPECT_EQ(f.slow_save_seconds(2, 2), 0);  // another step's save
  EXPECT_EQ(f.slow_save_seconds(4, 0), 0);  // another rank
  EXPECT_EQ(f.slow_save_seconds(2, 1), 5);  // no step: every save of rank 1
  EXPECT_EQ(f.slow_save_seconds(6, 1), 5);
  EXPECT_EQ(f.slow_arank_seconds(2), 0);
  EXPECT_EQ(f.describe(), "slow_save on rank 2: +60 s in the save of step 4; slow_save on rank 1: +5 s in the save");
  const std::pair<const char*, const char*> bad[] = {
      {"slow_save:rank=0", "needs seconds="},
      {"slow_save:seconds=3", "needs rank="},
      {"slow_save:rank=0,seconds=3,count=2", "unknown key 'count' for slow_save (known: rank, seconds, step)"},
  };
  for (const auto& [spec, want] : bad) {
    const std::string err = error_of(spec);
    EXPECT_NE(err.find(want), std::string::npos) << spec << " -> " << err;
  }
}

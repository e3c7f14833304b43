// LR schedule: warmup and cosine values, the floor after the horizon, and exact restore from its state.
#include "trainer/lr_schedule.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>

TEST(LRSchedule, LinearWarmupThenCosineToTheFloor) {
  gmod::LRSchedule s(1e-3, 1e-4, /*warmup=*/4, /*total=*/14);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.25e-3);  // the first step already moves
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.5e-3);
  EXPECT_DOUBLE_EQ(s.lr_at(3), 1e-3);     // the warmup-th step reaches the peak
  EXPECT_DOUBLE_EQ(s.lr_at(4), 1e-3);     // cosine starts at the peak
  EXPECT_NEAR(s.lr_at(9), 1e-4 + 0.9e-3 * 0.5, 1e-15);  // half-way: the mean of peak and floor
  EXPECT_NEAR(s.lr_at(6), 1e-4 + 0.9e-3 * 0.5 * (1 + std::cos(M_PI * 0.2)), 1e-15);
  EXPECT_DOUBLE_EQ(s.lr_at(14), 1e-4);
  EXPECT_DOUBLE_EQ(s.lr_at(100), 1e-4);   // stays at the floor past the horizon
  for (int64_t i = 4; i < 14; ++i) EXPECT_GE(s.lr_at(i), s.lr_at(i + 1));
}

TEST(LRSchedule, NoWarmupStartsAtThePeak) {
  gmod::LRSchedule s(2e-5, 0, 0, 10);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 2e-5);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.0);
}

TEST(LRSchedule, StateRestoresTheStepExactly) {
  gmod::LRSchedule a(1e-3, 0, 3, 20);
  for (int i = 0; i < 7; ++i) a.advance();
  gmod::LRSchedule b(1e-3, 0, 3, 20);
  EXPECT_EQ(b.load_state(nlohmann::json::parse(a.state().dump())), "");
  EXPECT_EQ(b.step(), 7);
  EXPECT_EQ(b.current(), a.current());
  gmod::LRSchedule longer(1e-3, 0, 3, 40);
  EXPECT_NE(longer.load_state(a.state()).find("changed"), std::string::npos);
  EXPECT_EQ(longer.step(), 7);
}

TEST(LRSchedule, RejectsImpossibleShapes) {
  EXPECT_THROW(gmod::LRSchedule(1e-3, 0, 0, 0), std::invalid_argument);
  EXPECT_THROW(gmod::LRSchedule(1e-3, 2e-3, 0, 10), std::invalid_argument);
}

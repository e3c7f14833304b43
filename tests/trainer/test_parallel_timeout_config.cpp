// parallel.timeout_s (the watchdog's deadline, parallel/watchdog.h): 600 s by default, read from JSON and --set,
// saved in the effective config, and a value that is not a finite number > 0 is a named config error.
#include "trainer/train_config.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <limits>
#include <string>

namespace {

bool has_problem(const gmod::TrainConfig& c, const std::string& what) {
  for (const auto& p : gmod::check_train_config(c, 1))
    if (p.find(what) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST(ParallelTimeoutConfig, DefaultReadAndSaved) {
  EXPECT_EQ(gmod::TrainConfig{}.parallel.timeout_s, 600.0);
  const gmod::TrainConfig c = gmod::train_config_from_json(nlohmann::json{{"parallel", {{"timeout_s", 42.5}}}});
  EXPECT_EQ(c.parallel.timeout_s, 42.5);
  EXPECT_EQ(gmod::to_json(c)["parallel"]["timeout_s"].get<double>(), 42.5);
  const gmod::TrainConfig s = gmod::train_config_from_json(nlohmann::json::object(), {"parallel.timeout_s=7"});
  EXPECT_EQ(s.parallel.timeout_s, 7.0);
  EXPECT_FALSE(has_problem(s, "parallel.timeout_s"));
}

TEST(ParallelTimeoutConfig, NonPositiveOrNonFiniteIsANamedError) {
  for (double bad : {0.0, -5.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    gmod::TrainConfig c;
    c.parallel.timeout_s = bad;
    EXPECT_TRUE(has_problem(c, "parallel.timeout_s:")) << bad;
  }
  EXPECT_THROW(gmod::train_config_from_json(nlohmann::json{{"parallel", {{"timeout_s", "soon"}}}}),
               std::invalid_argument);
  EXPECT_THROW(gmod::train_config_from_json(nlohmann::json{{"parallel", {{"timeout", 5}}}}), std::invalid_argument);
}

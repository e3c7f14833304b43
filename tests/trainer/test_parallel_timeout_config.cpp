// parallel.timeout_s (the watchdog's deadline, parallel/watchdog.h): 600 s by default, read from JSON and --set,
// saved in the effective config, and a value that is not a finite number > 0 is a named config error.
#include "trainer/config/train_config.h"

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

// The phases' own deadlines (issue 19): 3600 s by default, read from JSON and --set, saved, validated like timeout_s.
TEST(ParallelTimeoutConfig, PhaseDeadlinesReadSavedAndValidated) {
  const gmod::TrainConfig d;
  EXPECT_EQ(d.parallel.arank_timeout_s, 3600.0);
  EXPECT_EQ(d.parallel.resume_check_timeout_s, 3600.0);
  EXPECT_EQ(d.parallel.save_timeout_s, 3600.0);
  const gmod::TrainConfig c = gmod::train_config_from_json(
      nlohmann::json{{"parallel", {{"arank_timeout_s", 7200}, {"resume_check_timeout_s", 900.5}}}},
      {"parallel.save_timeout_s=1800"});
  EXPECT_EQ(c.parallel.arank_timeout_s, 7200.0);
  EXPECT_EQ(c.parallel.resume_check_timeout_s, 900.5);
  EXPECT_EQ(c.parallel.save_timeout_s, 1800.0);
  const nlohmann::json saved = gmod::to_json(c)["parallel"];
  EXPECT_EQ(saved["arank_timeout_s"].get<double>(), 7200.0);
  EXPECT_EQ(saved["resume_check_timeout_s"].get<double>(), 900.5);
  EXPECT_EQ(saved["save_timeout_s"].get<double>(), 1800.0);
  for (const char* key : {"arank_timeout_s", "resume_check_timeout_s", "save_timeout_s"})
    for (double bad : {0.0, -1.0, std::numeric_limits<double>::infinity()}) {
      gmod::TrainConfig b;
      if (std::string(key) == "arank_timeout_s") b.parallel.arank_timeout_s = bad;
      if (std::string(key) == "resume_check_timeout_s") b.parallel.resume_check_timeout_s = bad;
      if (std::string(key) == "save_timeout_s") b.parallel.save_timeout_s = bad;
      EXPECT_TRUE(has_problem(b, std::string("parallel.") + key + ":")) << key << " " << bad;
    }
  EXPECT_THROW(gmod::train_config_from_json(nlohmann::json{{"parallel", {{"arank_timeout_s", "long"}}}}),
               std::invalid_argument);
}

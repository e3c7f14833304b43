// Metrics: the FLOP model behind MFU and the JSONL lines rank 0 writes.
#include "trainer/metrics.h"

#include "tests/common/paths.h"

#include <gtest/gtest.h>

#include <fstream>

TEST(Metrics, FlopModelIsSixNPlusAttention) {
  gmod::FlopModel f{1000, 2, 8};
  // 6*1000 + 12*2*8*16 per token.
  EXPECT_DOUBLE_EQ(f.train_flops(10, 16), 10 * (6000.0 + 12.0 * 2 * 8 * 16));
}

TEST(Metrics, LoggerAppendsOneJsonLinePerStepWithEveryField) {
  gmod::test::TempDir dir;
  {
    gmod::MetricsLogger log(dir.str(), true, /*peak_flops=*/1e6, 0);
    gmod::StepMetrics m;
    m.step = 1;
    m.total_steps = 2;
    m.loss = 2.5;
    m.lm_loss = 2.4;
    m.routing_loss = 10;
    m.tokens = 100;
    m.samples = 4;
    m.step_seconds = 0.5;
    m.data_wait_seconds = 0.1;
    m.flops = 2e5;
    m.skip_ratio = {{3, 0.5}};
    m.skip_ratio_routable = {{3, 0.8}};
    nlohmann::json j = log.log(m, gmod::memory_stats(at::kCPU));
    EXPECT_DOUBLE_EQ(j["tokens_per_s"].get<double>(), 200.0);
    EXPECT_DOUBLE_EQ(j["mfu"].get<double>(), 0.4);
    EXPECT_DOUBLE_EQ(j["data_wait_pct"].get<double>(), 20.0);
    EXPECT_GT(j["memory"]["rss_mb"].get<double>(), 1.0);
    log.log_eval(1, {{"loss", 1.0}});
  }
  std::ifstream in(dir.str("metrics.jsonl"));
  std::string l1, l2;
  ASSERT_TRUE(std::getline(in, l1));
  ASSERT_TRUE(std::getline(in, l2));
  auto j = nlohmann::json::parse(l1);
  for (const char* k : {"step", "loss", "lm_loss", "routing_loss", "grad_norm", "lr", "tokens_per_s", "samples_per_s",
                        "mfu", "data_wait_pct", "skipped", "skipped_total", "memory", "skip_ratio"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_DOUBLE_EQ(j["skip_ratio"]["3"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["skip_ratio_routable"]["3"].get<double>(), 0.8);
  EXPECT_EQ(nlohmann::json::parse(l2)["eval"]["loss"].get<double>(), 1.0);
}

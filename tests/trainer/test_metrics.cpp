// Metrics: the JSONL lines rank 0 writes (the FLOPs behind MFU: test_flops.cpp).
#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "tests/common/paths.h"
#include "trainer/metrics.h"

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
    m.dense_flops = 3e5;
    m.skip_ratio = {{3, 0.5}};
    m.skip_ratio_routable = {{3, 0.8}};
    nlohmann::json j = log.log(m, gmod::memory_stats(at::kCPU));
    EXPECT_DOUBLE_EQ(j["tokens_per_s"].get<double>(), 200.0);
    EXPECT_DOUBLE_EQ(j["mfu"].get<double>(), 0.4);
    EXPECT_DOUBLE_EQ(j["dense_flops"].get<double>(), 3e5);
    EXPECT_DOUBLE_EQ(j["data_wait_pct"].get<double>(), 20.0);
    // RSS against the kernel's other report of it (VmRSS in /proc/self/status, kB), read right after.
    std::ifstream status("/proc/self/status");
    double vmrss_mb = -1;
    for (std::string line; std::getline(status, line);)
      if (line.rfind("VmRSS:", 0) == 0) vmrss_mb = std::stod(line.substr(6)) / 1024.0;
    ASSERT_GT(vmrss_mb, 0) << "no VmRSS line in /proc/self/status";
    EXPECT_NEAR(j["memory"]["rss_mb"].get<double>(), vmrss_mb, 0.05 * vmrss_mb + 1.0);
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

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

gmod::StepMetrics step(int64_t s) {
  gmod::StepMetrics m;
  m.step = s;
  m.total_steps = 10;
  m.step_seconds = 0.1;
  return m;
}

}  // namespace

// A torn last line (a crash mid-write) is cut off when the logger opens the file again, so the next line is not glued
// onto it; a last line that is complete JSON only lacking its newline gets the newline.
TEST(Metrics, TornLastLineIsRepairedOnOpen) {
  gmod::test::TempDir dir;
  const std::string path = dir.str("metrics.jsonl");
  const std::string good = "{\"step\":1,\"loss\":2.0}\n{\"step\":2,\"loss\":1.5}\n";
  std::ofstream(path, std::ios::binary) << good << "{\"step\":3,\"lo";
  {
    gmod::MetricsLogger log(dir.str(), true, 1e6, 2);
    log.log(step(3), nlohmann::json::object());
  }
  std::string text = slurp(path);
  ASSERT_EQ(text.rfind(good, 0), 0u) << text;
  std::istringstream lines(text.substr(good.size()));
  std::string l;
  ASSERT_TRUE(std::getline(lines, l));
  EXPECT_EQ(nlohmann::json::parse(l)["step"].get<int64_t>(), 3);
  EXPECT_FALSE(std::getline(lines, l));

  std::ofstream(path, std::ios::binary) << good << "{\"step\":3}";
  EXPECT_NE(gmod::MetricsLogger::repair_torn_tail(path).find("lacked a newline"), std::string::npos);
  EXPECT_EQ(slurp(path), good + "{\"step\":3}\n");
  EXPECT_EQ(gmod::MetricsLogger::repair_torn_tail(path), "");  // complete: untouched

  std::ofstream(path, std::ios::binary) << "{\"step\":1,";  // a torn first line leaves an empty file
  EXPECT_NE(gmod::MetricsLogger::repair_torn_tail(path).find("removed a torn last line of 10 bytes"), std::string::npos);
  EXPECT_EQ(slurp(path), "");
  EXPECT_EQ(gmod::MetricsLogger::repair_torn_tail(dir.str("absent.jsonl")), "");
}

// Writes that fail (here: metrics.jsonl is /dev/full, every write gets ENOSPC) warn on the first failure and throw,
// naming the file and the reason, once max_write_failures fail in a row.
TEST(Metrics, FailedWritesWarnThenStop) {
  gmod::test::TempDir dir;
  ASSERT_EQ(::symlink("/dev/full", dir.str("metrics.jsonl").c_str()), 0);
  gmod::MetricsLogger log(dir.str(), true, 1e6, 0, /*max_write_failures=*/3);
  ::testing::internal::CaptureStdout();
  log.log(step(1), nlohmann::json::object());
  log.log_eval(1, {{"loss", 1.0}});
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(log.write_failures(), 2);
  EXPECT_NE(out.find("warning: metrics: cannot write " + dir.str("metrics.jsonl") + ": No space left on device"),
            std::string::npos) << out;
  EXPECT_EQ(out.find("warning", out.find("warning") + 1), std::string::npos) << "one warning per streak: " << out;
  try {
    log.log(step(2), nlohmann::json::object());
    ADD_FAILURE() << "no error after 3 failures in a row";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("3 writes to " + dir.str("metrics.jsonl") +
                                         " in a row failed (last: No space left on device)"),
              std::string::npos) << e.what();
  }
}

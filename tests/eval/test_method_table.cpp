// The method table of `gmod report` (eval/method_table.h) on hand-made metrics and stats: which step lines time
// the training (warm-up left out, eval and torn lines not step lines), the per-call prefill and per-step next-token
// times, ratios against the first row and n/a where a row has no figure; a file that cannot be read or has no step
// line is named. tests/cli/check_methods.py checks the same figures on real runs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "eval/method_table.h"

namespace gmod::eval {
namespace {

std::string write_metrics(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / ("gmod_method_table_" + name + ".jsonl");
  std::ofstream(path) << text;
  return path.string();
}

TEST(MethodTable, TrainingFiguresLeaveOutWarmupAndNonStepLines) {
  const std::string p = write_metrics(
      "steps",
      "{\"step\":1,\"step_s\":0.9,\"samples\":4,\"tokens\":400,\"flops\":4e12}\n"
      "{\"step\":2,\"step_s\":0.5,\"samples\":4,\"tokens\":400,\"flops\":4e12}\n"
      "{\"step\":3,\"step_s\":0.1,\"samples\":4,\"tokens\":400,\"flops\":2e12}\n"
      "{\"step\":3,\"eval\":{\"loss\":1.0}}\n"
      "{\"step\":4,\"step_s\":0.3,\"samp\n"  // torn by a crash: a bad line, not a step
      "{\"step\":4,\"step_s\":0.2,\"samples\":2,\"tokens\":100,\"flops\":2e12}\n"
      "{\"step\":5,\"step_s\":0.4,\"samples\":4,\"tokens\":300,\"flops\":2e12}\n");
  const Json f = training_figures(p, 2);
  EXPECT_EQ(f["steps"], 3);  // steps 3, 4, 5
  EXPECT_EQ(f["warmup_steps"], 2);
  EXPECT_EQ(f["bad_lines"], 1);
  EXPECT_NEAR(f["step_ms_median"].get<double>(), 200.0, 1e-9);
  EXPECT_NEAR(f["samples_per_s"].get<double>(), (4 + 2 + 4) / (0.1 + 0.2 + 0.4), 1e-9);
  EXPECT_NEAR(f["tokens_per_s"].get<double>(), (400 + 100 + 300) / (0.1 + 0.2 + 0.4), 1e-9);
  // FLOPs per trained sample over every step line, warm-up included.
  EXPECT_NEAR(f["train_tflops_per_sample"].get<double>(), 14.0 / 18.0, 1e-12);
  // Fewer step lines than the warm-up: none left out rather than no figure.
  const Json g = training_figures(p, 10);
  EXPECT_EQ(g["steps"], 5);
  EXPECT_NEAR(g["step_ms_median"].get<double>(), 400.0, 1e-9);
  std::filesystem::remove(p);
}

TEST(MethodTable, UnreadableOrStepLessMetricsAreNamed) {
  EXPECT_THROW(
      {
        try {
          training_figures("/nonexistent/run/metrics.jsonl", 2);
        } catch (const std::runtime_error& e) {
          EXPECT_NE(std::string(e.what()).find("/nonexistent/run/metrics.jsonl"), std::string::npos) << e.what();
          throw;
        }
      },
      std::runtime_error);
  const std::string p = write_metrics("nosteps", "{\"step\":3,\"eval\":{\"loss\":1.0}}\n");
  try {
    training_figures(p, 2);
    ADD_FAILURE() << "no error for a metrics file without step lines";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(p + ": no step line"), std::string::npos) << e.what();
  }
  std::filesystem::remove(p);
}

TEST(MethodTable, TimingPerCallAndRatiosAgainstTheFirstRow) {
  // 10 samples at batch 4: 3 prefill calls; 9 decode steps of the batch.
  const Json dense_stats = {{"samples", 10},        {"prefill_seconds", 0.3}, {"decode_seconds", 0.9},
                            {"decode_steps", 9},    {"kv_cache_bytes", 1000}, {"flops", 5e12}};
  const Json t = timing_figures(dense_stats, 4);
  EXPECT_NEAR(t["prefill_ms"].get<double>(), 100.0, 1e-9);
  EXPECT_NEAR(t["next_token_ms"].get<double>(), 100.0, 1e-9);
  EXPECT_NEAR(t["kv_bytes_per_sample"].get<double>(), 100.0, 1e-12);
  EXPECT_NEAR(t["tflops_per_sample"].get<double>(), 0.5, 1e-12);
  const Json mod_stats = {{"samples", 10},     {"prefill_seconds", 0.15}, {"decode_seconds", nullptr},
                          {"decode_steps", 9}, {"kv_cache_bytes", 600},   {"flops", 4e12}};
  const Json u = timing_figures(mod_stats, 4);
  EXPECT_TRUE(u["next_token_ms"].is_null());

  MethodRow dense{"dense", 50.0, {{"step_ms_median", 200.0}, {"samples_per_s", 20.0}}, {t}};
  MethodRow mod{"mod", 48.5, {{"step_ms_median", 150.0}, {"samples_per_s", 25.0}}, {u}};
  MethodRow free{"free", nullptr, nullptr, {u}};
  const Json table = build_method_table({dense, mod, free}, {4});
  const Json& m = table["rows"][1];
  EXPECT_NEAR(m["delta_average"].get<double>(), -1.5, 1e-12);
  EXPECT_NEAR(m["ratios"]["step_ms"].get<double>(), 0.75, 1e-12);
  EXPECT_NEAR(m["ratios"]["samples_per_s"].get<double>(), 1.25, 1e-12);
  EXPECT_NEAR(m["ratios"]["prefill_ms_b4"].get<double>(), 0.5, 1e-12);
  EXPECT_NEAR(m["ratios"]["kv_bytes_per_sample"].get<double>(), 0.6, 1e-12);
  EXPECT_NEAR(m["ratios"]["tflops_per_sample"].get<double>(), 0.8, 1e-12);
  EXPECT_TRUE(m["ratios"]["next_token_ms_b4"].is_null());
  const Json& f = table["rows"][2];
  EXPECT_TRUE(f["figures"]["step_ms"].is_null());
  EXPECT_TRUE(f["delta_average"].is_null());
  const std::string md = method_table_markdown(table);
  EXPECT_NE(md.find("| mod | 48.50 | -1.50 | 150.0 (0.75×) | 25.0 (1.25×) | n/a | 50.00 (0.50×) | n/a |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| free | n/a | n/a | n/a | n/a | n/a |"), std::string::npos) << md;
}

}  // namespace
}  // namespace gmod::eval

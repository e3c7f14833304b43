// The paper-style table of `gmod report` (eval/report.h) on hand-made score and stats files, each figure
// worked out by hand below: headline figures on the paper's scale, the average with MME perception / 20, skip
// ratio and TFLOPs over all samples, the changes against the first model, n/a for what was not measured.
#include <gtest/gtest.h>

#include "eval/report.h"

namespace gmod::eval {
namespace {

ReportCell cell(const char* figures, double samples, double flops, double processed, double total) {
  ReportCell c;
  c.score = {{"figures", Json::parse(figures)}, {"problem_count", 0}};
  c.stats = {{"samples", samples},
             {"problems", 0},
             {"flops", flops},
             {"dense_flops", flops * 2},
             {"layer_tokens", total},
             {"processed_layer_tokens", processed},
             {"mod_layer_tokens", total / 2},
             {"processed_mod_layer_tokens", processed - total / 2},
             {"wall_seconds", 2.0},
             {"prefill_seconds", nullptr},
             {"decode_seconds", nullptr}};
  return c;
}

TEST(Report, FiguresAverageSkipTflopsAndDeltas) {
  ReportInput in;
  in.models = {"dense", "mod"};
  in.benchmarks = {
      {"GQA", "gqa", ""}, {"MME", "mme", ""}, {"POPE", "pope", ""}, {"SQA-IMG", "scienceqa", ""}};
  in.cells = {
      {cell(R"({"accuracy": 0.5})", 10, 10e12, 100, 100),
       cell(R"({"perception": 1000.0})", 10, 10e12, 100, 100),
       cell(R"({"mean_f1": 0.8})", 10, 10e12, 100, 100), cell(R"({"img_acc": 70.0})", 10, 10e12, 100, 100)},
      {cell(R"({"accuracy": 0.25})", 10, 5e12, 60, 100), cell(R"({"perception": 1200.0})", 10, 5e12, 60, 100),
       cell(R"({"mean_f1": null})", 10, 5e12, 60, 100), cell(R"({"img_acc": 60.0})", 30, 15e12, 60, 100)}};
  const Json r = build_report(in);
  const Json& d = r["models"][0];
  const Json& m = r["models"][1];
  EXPECT_DOUBLE_EQ(d["scores"]["GQA"].get<double>(), 50.0);
  EXPECT_DOUBLE_EQ(d["scores"]["MME"].get<double>(), 1000.0);
  EXPECT_DOUBLE_EQ(d["scores"]["POPE"].get<double>(), 80.0);
  EXPECT_DOUBLE_EQ(d["scores"]["SQA-IMG"].get<double>(), 70.0);
  EXPECT_DOUBLE_EQ(d["average"].get<double>(), (50 + 50 + 80 + 70) / 4.0);  // MME 1000 / 20 = 50
  EXPECT_TRUE(m["scores"]["POPE"].is_null());
  EXPECT_DOUBLE_EQ(m["average"].get<double>(), (25 + 60 + 60) / 3.0);  // POPE left out
  EXPECT_DOUBLE_EQ(d["skip_ratio"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(m["skip_ratio"].get<double>(), 1 - 240.0 / 400.0);
  EXPECT_DOUBLE_EQ(m["skip_ratio_mod_layers"].get<double>(), 1 - 40.0 / 200.0);
  EXPECT_DOUBLE_EQ(d["tflops_per_sample"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(m["tflops_per_sample"].get<double>(), 30.0 / 60.0);
  EXPECT_DOUBLE_EQ(m["delta_average"].get<double>(), (25 + 60 + 60) / 3.0 - 62.5);
  EXPECT_DOUBLE_EQ(m["delta_tflops_percent"].get<double>(), -50.0);
  EXPECT_TRUE(m["prefill_ms"].is_null());
  EXPECT_TRUE(m["decode_ms_per_token"].is_null());
  EXPECT_DOUBLE_EQ(m["samples_per_second"].get<double>(), 60.0 / 8.0);
  const std::string md = report_markdown(r);
  EXPECT_NE(md.find("| Model | GQA | MME | POPE | SQA-IMG | Avg | Skip | TFLOPs |"), std::string::npos) << md;
  EXPECT_NE(
      md.find("| dense | 50.00 | 1000.00 | 80.00 | 70.00 | 62.50 | 0.0% | 1 | n/a | n/a | +0.00 | +0.0% |"),
      std::string::npos)
      << md;
  EXPECT_NE(
      md.find("| mod | 25.00 | 1200.00 | n/a | 60.00 | 48.33 | 40.0% | 0.5 | n/a | n/a | -14.17 | -50.0% |"),
      std::string::npos)
      << md;
  const std::string svg = report_svg(r);
  EXPECT_NE(svg.find(">dense</text>"), std::string::npos);
  EXPECT_NE(svg.find(">mod</text>"), std::string::npos);
}

TEST(Report, TimingShownOnlyWhenEveryBenchmarkMeasuredIt) {
  ReportInput in;
  in.models = {"m"};
  in.benchmarks = {{"GQA", "gqa", ""}, {"MMMU", "mmmu", ""}};
  in.cells = {{cell(R"({"accuracy": 0.5})", 4, 4e12, 10, 10), cell(R"({"accuracy": 0.5})", 6, 6e12, 10, 10)}};
  in.cells[0][0].stats["prefill_seconds"] = 0.4, in.cells[0][0].stats["decode_seconds"] = 1.0;
  in.cells[0][0].stats["decode_steps"] = 10;
  EXPECT_TRUE(build_report(in)["models"][0]["prefill_ms"].is_null());
  in.cells[0][1].stats["prefill_seconds"] = 0.6, in.cells[0][1].stats["decode_seconds"] = 3.0;
  in.cells[0][1].stats["decode_steps"] = 30;
  const Json r = build_report(in);
  EXPECT_DOUBLE_EQ(r["models"][0]["prefill_ms"].get<double>(), 1.0 / 10 * 1e3);
  EXPECT_DOUBLE_EQ(r["models"][0]["decode_ms_per_token"].get<double>(), 4.0 / 40 * 1e3);
}

TEST(Report, FigureOverrideAndUnknownScorer) {
  ReportInput in;
  in.models = {"m"};
  in.benchmarks = {{"POPE adv", "pope", "splits/adversarial/f1"}};
  in.cells = {{cell(R"({"splits": {"adversarial": {"f1": 0.75}}, "mean_f1": 0.9})", 1, 1e12, 1, 1)}};
  EXPECT_DOUBLE_EQ(build_report(in)["models"][0]["scores"]["POPE adv"].get<double>(), 0.75);
  EXPECT_THROW(headline("vizwiz"), std::invalid_argument);
}

}  // namespace
}  // namespace gmod::eval

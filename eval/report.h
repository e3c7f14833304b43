// The paper-style table of `gmod report` (docs/eval.md): for each model (rows, the first one the reference)
// and benchmark (columns) the headline figure of the benchmark's score as the γ-MoD paper shows it, the
// model's average over the benchmarks, its skip ratio and TFLOPs per sample over every answered question, its
// prefill and decode time where `gmod answer` measured them, and the change against the first model; as JSON,
// Markdown, and an SVG plot of average accuracy against TFLOPs. Built from what `gmod score --json` and
// `gmod answer --stats` write, so a table can be rebuilt from the files alone.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "eval/records.h"

namespace gmod::eval {

// A benchmark's headline figure: the path of the figure in `gmod score`'s figures, and the factor to the
// paper's scale (accuracy fractions -> %, ScienceQA already in %, MME perception as a score of up to 2000).
struct Headline {
  std::string figure;
  double scale = 1;
  // The factor that brings the figure to a 0-100 scale for the average (MME perception / 20).
  double average_scale = 1;
};
// Throws std::invalid_argument for a scorer `gmod score` does not know.
Headline headline(const std::string& scorer);
// The figure at `path` ("accuracy", "splits/adversarial/f1") of `figures`, or nullopt when absent or null.
std::optional<double> figure_at(const Json& figures, const std::string& path);

struct ReportCell {
  Json score;  // `gmod score --json` output ({figures, problem_count, ...})
  Json stats;  // `gmod answer --stats` output
};

struct ReportBenchmark {
  std::string name, scorer;
  std::string figure;  // "" = the scorer's headline figure
};

struct ReportInput {
  std::vector<std::string> models;  // display names; the first is the reference
  std::vector<ReportBenchmark> benchmarks;
  std::vector<std::vector<ReportCell>> cells;  // [model][benchmark]
};

// The table as JSON: {"benchmarks": [{name, scorer, figure, scale}], "models": [{name, scores: {bench:
// value|null}, average, skip_ratio, skip_ratio_mod_layers, tflops_per_sample, prefill_ms,
// decode_ms_per_token, samples, problems, delta_average, delta_tflops_percent}]}. The average is over the
// benchmarks that have a figure (on the 0-100 scale); skip ratios and TFLOPs are over all answered samples of
// the model.
Json build_report(const ReportInput& in);
std::string report_markdown(const Json& report);
// Average accuracy (y) against TFLOPs per sample (x), one labelled point per model.
std::string report_svg(const Json& report);

}  // namespace gmod::eval

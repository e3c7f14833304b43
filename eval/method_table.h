// The method comparison of `gmod report` (docs/mod.md, "Every method on one run"): for each model of a suite, what
// its training run measured (the step lines of its metrics.jsonl), what its timing runs measured (`gmod answer
// --ignore-eos --stats` on one question set at each batch size), the K/V bytes its caches held after the prefill
// and the FLOPs it executed, next to the accuracy average of the paper-style table, each as a ratio to the first
// model (the dense reference). Built from files alone, like the paper-style table (eval/report.h).
#pragma once

#include <string>
#include <vector>

#include "eval/records.h"

namespace gmod::eval {

// From a run's metrics.jsonl: the step lines (objects with "step_s"), the first `warmup` of them left out of the
// times (allocation and first-touch costs), none left out when there are no more. Returns {"steps": measured lines,
// "step_ms_median", "samples_per_s" (Σ samples / Σ step_s), "tokens_per_s", "train_tflops_per_sample" (Σ flops /
// Σ samples over every step line: forward + backward, mod/accounting.h's convention)}. Throws std::runtime_error
// naming the file when it cannot be read or has no step line; bad lines are named too.
Json training_figures(const std::string& metrics_path, int warmup);

// From the stats of one timing run (`gmod answer --stats`, batch `batch`): {"batch", "samples", "prefill_ms" (per
// prefill call of `batch` prompts: prefill_seconds / ceil(samples / batch)), "next_token_ms" (decode_seconds /
// decode_steps: one new token for each sample of the batch), "kv_bytes_per_sample", "tflops_per_sample"}. Figures
// the stats lack are null.
Json timing_figures(const Json& stats, int batch);

struct MethodRow {
  std::string name;
  Json average;  // the paper-style table's average accuracy (null: none)
  Json train;    // training_figures, or null (the model was not trained by the suite)
  Json timing;   // timing_figures per batch size, in the suite's order (empty: no timing runs)
};

// The table as JSON: {"batches": [...], "rows": [{name, average, delta_average, train, timing, ratios: {step_ms,
// samples_per_s, train_tflops_per_sample, prefill_ms_b<B>, next_token_ms_b<B>, kv_bytes_per_sample,
// tflops_per_sample}}]}: each ratio is the row's figure over the first row's (null where either is missing or the
// first row's is 0).
Json build_method_table(const std::vector<MethodRow>& rows, const std::vector<int>& batches);
std::string method_table_markdown(const Json& table);

}  // namespace gmod::eval

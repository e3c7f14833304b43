// The method comparison of `gmod report` (see method_table.h).
#include "eval/method_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <stdexcept>

#include "eval/report.h"

namespace gmod::eval {
namespace {

std::optional<double> number(const Json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return std::nullopt;
  return j[key].get<double>();
}

Json or_null(std::optional<double> v) { return v ? Json(*v) : Json(); }

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// "12.3 (0.81×)"; "n/a" without a figure; the ratio left out without one.
std::string cell(const Json& v, const Json& ratio, const char* f) {
  if (!v.is_number()) return "n/a";
  std::string s = fmt(f, v.get<double>());
  if (ratio.is_number()) s += " (" + fmt("%.2f", ratio.get<double>()) + "×)";
  return s;
}

// A row's figure `key` of `j` (null when `j` has none: not trained, not timed), through the report's figure_at.
Json field(const Json& j, const char* key) { return or_null(figure_at(j, key)); }

}  // namespace

Json training_figures(const std::string& metrics_path, int warmup) {
  std::vector<Problem> problems;
  const std::vector<Record> records = read_jsonl(metrics_path, &problems);
  std::vector<const Json*> steps;
  for (const Record& r : records)
    if (r.value.contains("step_s") && r.value["step_s"].is_number()) steps.push_back(&r.value);
  if (steps.empty())
    throw std::runtime_error(metrics_path + ": no step line (an object with \"step_s\"); did the training run?");
  double flops = 0, all_samples = 0;
  for (const Json* s : steps) flops += number(*s, "flops").value_or(0), all_samples += number(*s, "samples").value_or(0);
  const size_t skip = steps.size() > static_cast<size_t>(std::max(warmup, 0)) ? static_cast<size_t>(std::max(warmup, 0)) : 0;
  std::vector<double> ms;
  double secs = 0, samples = 0, tokens = 0;
  for (size_t i = skip; i < steps.size(); ++i) {
    const double t = number(*steps[i], "step_s").value_or(0);
    ms.push_back(t * 1e3);
    secs += t;
    samples += number(*steps[i], "samples").value_or(0);
    tokens += number(*steps[i], "tokens").value_or(0);
  }
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  const double median = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
  Json j = {{"metrics", metrics_path},
            {"steps", static_cast<int64_t>(n)},
            {"warmup_steps", static_cast<int64_t>(skip)},
            {"step_ms_median", median},
            {"samples_per_s", secs > 0 ? Json(samples / secs) : Json()},
            {"tokens_per_s", secs > 0 ? Json(tokens / secs) : Json()},
            {"train_tflops_per_sample", all_samples > 0 ? Json(flops / all_samples / 1e12) : Json()},
            {"bad_lines", static_cast<int64_t>(problems.size())}};
  return j;
}

Json timing_figures(const Json& stats, int batch) {
  const auto samples = number(stats, "samples"), prefill = number(stats, "prefill_seconds"),
             decode = number(stats, "decode_seconds"), steps = number(stats, "decode_steps"),
             kv = number(stats, "kv_cache_bytes"), flops = number(stats, "flops");
  const bool have = samples && *samples > 0;
  const double calls = have ? std::ceil(*samples / std::max(batch, 1)) : 0;
  return {{"batch", batch},
          {"samples", or_null(samples)},
          {"prefill_ms", have && prefill ? Json(*prefill / calls * 1e3) : Json()},
          {"next_token_ms", decode && steps && *steps > 0 ? Json(*decode / *steps * 1e3) : Json()},
          {"kv_bytes_per_sample", have && kv ? Json(*kv / *samples) : Json()},
          {"tflops_per_sample", have && flops ? Json(*flops / *samples / 1e12) : Json()}};
}

Json build_method_table(const std::vector<MethodRow>& rows, const std::vector<int>& batches) {
  if (rows.empty()) throw std::invalid_argument("method table: no rows");
  // Every figure that gets a ratio, and where it is in a row.
  struct Figure {
    std::string key;
    std::function<Json(const MethodRow&)> get;
  };
  std::vector<Figure> figs = {
      {"step_ms", [](const MethodRow& r) { return field(r.train, "step_ms_median"); }},
      {"samples_per_s", [](const MethodRow& r) { return field(r.train, "samples_per_s"); }},
      {"train_tflops_per_sample", [](const MethodRow& r) { return field(r.train, "train_tflops_per_sample"); }},
  };
  for (size_t i = 0; i < batches.size(); ++i) {
    const std::string b = std::to_string(batches[i]);
    figs.push_back({"prefill_ms_b" + b, [i](const MethodRow& r) {
                      return i < r.timing.size() ? field(r.timing[i], "prefill_ms") : Json();
                    }});
    figs.push_back({"next_token_ms_b" + b, [i](const MethodRow& r) {
                      return i < r.timing.size() ? field(r.timing[i], "next_token_ms") : Json();
                    }});
  }
  // K/V bytes and FLOPs per sample do not depend on the batch size: the first timing run's.
  figs.push_back({"kv_bytes_per_sample", [](const MethodRow& r) {
                    return r.timing.empty() ? Json() : field(r.timing[0], "kv_bytes_per_sample");
                  }});
  figs.push_back({"tflops_per_sample", [](const MethodRow& r) {
                    return r.timing.empty() ? Json() : field(r.timing[0], "tflops_per_sample");
                  }});
  Json out = {{"batches", batches}, {"rows", Json::array()}};
  const MethodRow& ref = rows[0];
  for (const MethodRow& r : rows) {
    Json row = {{"name", r.name}, {"average", r.average}, {"train", r.train}, {"timing", r.timing},
                {"figures", Json::object()}, {"ratios", Json::object()}};
    row["delta_average"] = r.average.is_number() && ref.average.is_number()
                               ? Json(r.average.get<double>() - ref.average.get<double>())
                               : Json();
    for (const Figure& f : figs) {
      const Json v = f.get(r), base = f.get(ref);
      row["figures"][f.key] = v.is_number() ? v : Json();
      row["ratios"][f.key] = v.is_number() && base.is_number() && base.get<double>() != 0
                                 ? Json(v.get<double>() / base.get<double>())
                                 : Json();
    }
    out["rows"].push_back(row);
  }
  return out;
}

std::string method_table_markdown(const Json& table) {
  std::vector<int> batches = table["batches"].get<std::vector<int>>();
  std::string head = "| Method | Avg | Δ Avg | Train step (ms) | Train samples/s | Train TFLOPs/sample |",
              rule = "|---|---:|---:|---:|---:|---:|";
  for (int b : batches) {
    head += " Prefill b" + std::to_string(b) + " (ms) | Next token b" + std::to_string(b) + " (ms) |";
    rule += "---:|---:|";
  }
  head += " KV after prefill (KiB/sample) | TFLOPs/sample |";
  rule += "---:|---:|";
  std::string md = head + "\n" + rule + "\n";
  for (const Json& row : table["rows"]) {
    const Json& f = row["figures"];
    const Json& q = row["ratios"];
    auto c = [&](const std::string& key, const char* format) { return " " + cell(f[key], q[key], format) + " |"; };
    md += "| " + row["name"].get<std::string>() + " |";
    md += " " + (row["average"].is_number() ? fmt("%.2f", row["average"].get<double>()) : std::string("n/a")) + " |";
    md += " " + (row["delta_average"].is_number() ? fmt("%+.2f", row["delta_average"].get<double>())
                                                 : std::string("n/a")) +
          " |";
    md += c("step_ms", "%.1f") + c("samples_per_s", "%.1f") + c("train_tflops_per_sample", "%.3g");
    for (int b : batches)
      md += c("prefill_ms_b" + std::to_string(b), "%.2f") + c("next_token_ms_b" + std::to_string(b), "%.2f");
    Json kib = f["kv_bytes_per_sample"].is_number() ? Json(f["kv_bytes_per_sample"].get<double>() / 1024) : Json();
    md += " " + cell(kib, q["kv_bytes_per_sample"], "%.1f") + " |";
    md += c("tflops_per_sample", "%.3g") + "\n";
  }
  md +=
      "\n(×): against the first row. Train: the step lines of each run's metrics.jsonl after the warm-up steps (median "
      "step time; samples/s = samples / time), FLOPs forward + backward per trained sample. Prefill bB: one prefill "
      "of B prompts; next token bB: one decode step of the batch (every answer generated to --max-new-tokens, past "
      "EOS); both from `gmod answer --ignore-eos` on the timing questions in one process. KV: the K/V entries the "
      "caches hold after the prefill (no padding). FLOPs: executed matmul FLOPs (2 per multiply-add; decoder "
      "projections and attention pairs, LM head, vision tower, projector; mod/accounting.h).\n";
  return md;
}

}  // namespace gmod::eval

// The paper-style table of `gmod report` (see report.h).
#include "eval/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "eval/pystr.h"
#include "eval/score.h"

namespace gmod::eval {
namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

double num(const Json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
}

// Sum of `key` over a model's cells, or nullopt when any cell lacks it (a figure is shown only when every
// benchmark measured it).
std::optional<double> sum_all(const std::vector<ReportCell>& cells, const char* key) {
  double s = 0;
  for (const ReportCell& c : cells) {
    if (!c.stats.contains(key) || !c.stats[key].is_number()) return std::nullopt;
    s += c.stats[key].get<double>();
  }
  return s;
}

std::string escape_xml(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

std::string cell_text(const Json& v, const char* f) {
  return v.is_number() ? fmt(f, v.get<double>()) : "n/a";
}

}  // namespace

Headline headline(const std::string& scorer) {
  if (scorer == "textvqa" || scorer == "vqav2" || scorer == "gqa" || scorer == "mmbench" || scorer == "mmmu")
    return {"accuracy", 100, 1};
  if (scorer == "scienceqa") return {"img_acc", 1, 1};      // SQA-IMG, already in %
  if (scorer == "pope") return {"mean_f1", 100, 1};         // F1 averaged over the splits, as LLaVA reports
  if (scorer == "mme") return {"perception", 1, 1 / 20.0};  // out of 2000
  throw std::invalid_argument("unknown scorer '" + scorer +
                              "' (gmod score knows: textvqa, vqav2, gqa, "
                              "scienceqa, pope, mme, mmbench, mmmu)");
}

std::optional<double> figure_at(const Json& figures, const std::string& path) {
  const Json* j = &figures;
  for (const std::string& key : py::split(path, "/")) {
    if (!j->is_object() || !j->contains(key)) return std::nullopt;
    j = &(*j)[key];
  }
  if (!j->is_number()) return std::nullopt;
  return j->get<double>();
}

Json build_report(const ReportInput& in) {
  if (in.models.empty() || in.benchmarks.empty())
    throw std::invalid_argument("a report needs at least one model and one benchmark");
  if (in.cells.size() != in.models.size())
    throw std::invalid_argument("report: one row of cells per model expected");
  Json out = {{"benchmarks", Json::array()}, {"models", Json::array()}};
  std::vector<Headline> heads;
  for (const ReportBenchmark& b : in.benchmarks) {
    Headline h = headline(b.scorer);
    if (!b.figure.empty()) h.figure = b.figure, h.scale = 1, h.average_scale = 1;
    heads.push_back(h);
    out["benchmarks"].push_back(
        {{"name", b.name}, {"scorer", b.scorer}, {"figure", h.figure}, {"scale", h.scale}});
  }
  for (size_t m = 0; m < in.models.size(); ++m) {
    const std::vector<ReportCell>& cells = in.cells[m];
    if (cells.size() != in.benchmarks.size())
      throw std::invalid_argument("report: model " + in.models[m] + " has " + std::to_string(cells.size()) +
                                  " cells for " + std::to_string(in.benchmarks.size()) + " benchmarks");
    Json row = {{"name", in.models[m]}, {"scores", Json::object()}};
    double avg_sum = 0, samples = 0, problems = 0;
    int avg_n = 0;
    for (size_t b = 0; b < cells.size(); ++b) {
      const Json& figures = cells[b].score.contains("figures") ? cells[b].score["figures"] : Json();
      const std::optional<double> v = figure_at(figures, heads[b].figure);
      row["scores"][in.benchmarks[b].name] = v ? Json(*v * heads[b].scale) : Json();
      if (v) avg_sum += *v * heads[b].scale * heads[b].average_scale, ++avg_n;
      samples += num(cells[b].stats, "samples");
      problems += num(cells[b].score, "problem_count") + num(cells[b].stats, "problems");
    }
    row["average"] = avg_n ? Json(avg_sum / avg_n) : Json();
    row["samples"] = samples;
    row["problems"] = problems;
    const auto processed = sum_all(cells, "processed_layer_tokens"), total = sum_all(cells, "layer_tokens");
    const auto mod_processed = sum_all(cells, "processed_mod_layer_tokens"),
               mod_total = sum_all(cells, "mod_layer_tokens");
    const auto flops = sum_all(cells, "flops"), dense = sum_all(cells, "dense_flops");
    row["skip_ratio"] = processed && total && *total > 0 ? Json(1 - *processed / *total) : Json();
    row["skip_ratio_mod_layers"] =
        mod_processed && mod_total && *mod_total > 0 ? Json(1 - *mod_processed / *mod_total) : Json(0.0);
    row["tflops_per_sample"] = flops && samples > 0 ? Json(*flops / samples / 1e12) : Json();
    row["dense_tflops_per_sample"] = dense && samples > 0 ? Json(*dense / samples / 1e12) : Json();
    // Timing: present once `gmod answer` measures prefill and decode separately (null in its stats until
    // then).
    const auto prefill = sum_all(cells, "prefill_seconds"), decode = sum_all(cells, "decode_seconds");
    const auto decode_steps = sum_all(cells, "decode_steps");
    row["prefill_ms"] = prefill && samples > 0 ? Json(*prefill / samples * 1e3) : Json();
    row["decode_ms_per_token"] =
        decode && decode_steps && *decode_steps > 0 ? Json(*decode / *decode_steps * 1e3) : Json();
    const auto wall = sum_all(cells, "wall_seconds");
    row["samples_per_second"] = wall && *wall > 0 ? Json(samples / *wall) : Json();
    out["models"].push_back(row);
  }
  const Json& ref = out["models"][0];
  for (Json& row : out["models"]) {
    row["delta_average"] = row["average"].is_number() && ref["average"].is_number()
                               ? Json(row["average"].get<double>() - ref["average"].get<double>())
                               : Json();
    const bool t = row["tflops_per_sample"].is_number() && ref["tflops_per_sample"].is_number() &&
                   ref["tflops_per_sample"].get<double>() > 0;
    row["delta_tflops_percent"] =
        t ? Json((row["tflops_per_sample"].get<double>() / ref["tflops_per_sample"].get<double>() - 1) * 100)
          : Json();
  }
  return out;
}

std::string report_markdown(const Json& report) {
  std::string head = "| Model |", rule = "|---|";
  for (const Json& b : report["benchmarks"])
    head += " " + b["name"].get<std::string>() + " |", rule += "---:|";
  head += " Avg | Skip | TFLOPs | Prefill (ms) | Decode (ms/token) | Δ Avg | Δ TFLOPs |";
  rule += "---:|---:|---:|---:|---:|---:|---:|";
  std::string md = head + "\n" + rule + "\n";
  for (const Json& row : report["models"]) {
    md += "| " + row["name"].get<std::string>() + " |";
    for (const Json& b : report["benchmarks"])
      md += " " + cell_text(row["scores"][b["name"].get<std::string>()], "%.2f") + " |";
    md += " " + cell_text(row["average"], "%.2f") + " |";
    md += " " +
          (row["skip_ratio"].is_number() ? fmt("%.1f%%", 100 * row["skip_ratio"].get<double>()) : "n/a") +
          " |";
    md += " " + cell_text(row["tflops_per_sample"], "%.4g") + " |";
    md += " " + cell_text(row["prefill_ms"], "%.2f") + " |";
    md += " " + cell_text(row["decode_ms_per_token"], "%.2f") + " |";
    md += " " + cell_text(row["delta_average"], "%+.2f") + " |";
    md += " " +
          (row["delta_tflops_percent"].is_number() ? fmt("%+.1f%%", row["delta_tflops_percent"].get<double>())
                                                   : "n/a") +
          " |\n";
  }
  md +=
      "\nAvg: mean of the benchmark columns on a 0-100 scale (MME perception / 20). Skip: share of "
      "token-layer "
      "visits skipped over all layers. TFLOPs: executed forward FLOPs per answered sample (prefill and "
      "decode). Δ: against the first row.\n";
  return md;
}

std::string report_svg(const Json& report) {
  const double W = 640, H = 420, L = 70, R = 20, T = 40, B = 60;
  std::vector<std::pair<double, double>> pts;
  for (const Json& row : report["models"])
    if (row["tflops_per_sample"].is_number() && row["average"].is_number())
      pts.push_back({row["tflops_per_sample"].get<double>(), row["average"].get<double>()});
  double x0 = 0, x1 = 1, y0 = 0, y1 = 100;
  if (!pts.empty()) {
    x0 = x1 = pts[0].first, y0 = y1 = pts[0].second;
    for (auto [x, y] : pts)
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    const double dx = std::max((x1 - x0) * 0.15, std::max(std::abs(x1) * 0.05, 1e-12));
    const double dy = std::max((y1 - y0) * 0.15, 1.0);
    x0 -= dx, x1 += dx, y0 -= dy, y1 += dy;
  }
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fmt("%.0f", W) + "\" height=\"" +
                  fmt("%.0f", H) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"" + fmt("%.0f", W / 2) +
       "\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">average accuracy vs "
       "TFLOPs per sample</text>\n";
  s += "<line x1=\"" + fmt("%.1f", L) + "\" y1=\"" + fmt("%.1f", H - B) + "\" x2=\"" + fmt("%.1f", W - R) +
       "\" y2=\"" + fmt("%.1f", H - B) + "\" stroke=\"black\"/>\n";
  s += "<line x1=\"" + fmt("%.1f", L) + "\" y1=\"" + fmt("%.1f", T) + "\" x2=\"" + fmt("%.1f", L) +
       "\" y2=\"" + fmt("%.1f", H - B) + "\" stroke=\"black\"/>\n";
  for (int k = 0; k <= 4; ++k) {
    const double x = x0 + (x1 - x0) * k / 4, y = y0 + (y1 - y0) * k / 4;
    s += "<text x=\"" + fmt("%.1f", px(x)) + "\" y=\"" + fmt("%.1f", H - B + 16) +
         "\" text-anchor=\"middle\">" + fmt("%.3g", x) + "</text>\n";
    s += "<text x=\"" + fmt("%.1f", L - 6) + "\" y=\"" + fmt("%.1f", py(y) + 4) + "\" text-anchor=\"end\">" +
         fmt("%.1f", y) + "</text>\n";
  }
  s += "<text x=\"" + fmt("%.0f", (L + W - R) / 2) + "\" y=\"" + fmt("%.0f", H - 18) +
       "\" text-anchor=\"middle\">TFLOPs per sample</text>\n";
  s += "<text x=\"16\" y=\"" + fmt("%.0f", (T + H - B) / 2) +
       "\" text-anchor=\"middle\" transform=\"rotate(-90 16 " + fmt("%.0f", (T + H - B) / 2) +
       ")\">average accuracy</text>\n";
  for (const Json& row : report["models"]) {
    if (!row["tflops_per_sample"].is_number() || !row["average"].is_number()) continue;
    const double x = px(row["tflops_per_sample"].get<double>()), y = py(row["average"].get<double>());
    s += "<circle cx=\"" + fmt("%.1f", x) + "\" cy=\"" + fmt("%.1f", y) + "\" r=\"5\" fill=\"#1f77b4\"/>\n";
    s += "<text x=\"" + fmt("%.1f", x + 8) + "\" y=\"" + fmt("%.1f", y - 8) + "\">" +
         escape_xml(row["name"].get<std::string>()) + "</text>\n";
  }
  return s + "</svg>\n";
}

}  // namespace gmod::eval

// `gmod plot --metrics RUN_DIR/metrics.jsonl [--out DIR]`: PNG plots of a training run with gnuplot:
// loss curves (loss, lm_loss, routing_loss, held-out eval loss), skip ratio per MoD layer (of all tokens, the
// paper's α, solid; of the routable tokens, dashed), learning rate and tokens/s. The data files (*.dat) and
// gnuplot scripts (*.gp) are written next to the PNGs so a plot can be restyled and rerun by hand
// (`gnuplot loss.gp`). A line that is not a JSON object with a numeric "step" (a torn write, two lines glued
// together by an old crash) is skipped and reported with its line number; the file is rejected only when no
// training step line is left.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "launch/args.h"

namespace gmod::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct PlotOptions {
  std::string metrics, out;
  std::string gnuplot = "gnuplot";
};

// Output of a shell command (stdout and stderr), and its exit status.
std::pair<int, std::string> capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, out};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  return {rc, out};
}

double num(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

std::string fmt(double v) {
  if (std::isnan(v)) return "NaN";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream f(p);
  if (!f) throw std::runtime_error("cannot write " + p.string());
  f << text;
}

std::string header(const std::string& terminal, const std::string& png, const std::string& title,
                   const std::string& ylabel) {
  return "set terminal " + terminal + " size 900,540\nset output '" + png + "'\nset title '" + title +
         "' noenhanced\nset xlabel 'step'\nset ylabel '" + ylabel + "'\nset grid\nset key outside right top\n" +
         "set datafile missing 'NaN'\n";
}

int run_plot(const PlotOptions& o) {
  const fs::path mpath = fs::is_directory(o.metrics) ? fs::path(o.metrics) / "metrics.jsonl" : fs::path(o.metrics);
  const fs::path out = o.out.empty() ? mpath.parent_path() / "plots" : fs::path(o.out);
  const std::string& gnuplot = o.gnuplot;

  // gnuplot first, so a missing one is reported before any work.
  auto [rc, terms] = capture(shell_quote(gnuplot) + " -e 'set terminal'");
  if (rc != 0 || terms.find("png") == std::string::npos)
    throw std::runtime_error("gnuplot ('" + gnuplot +
                             "') is not installed or has no PNG terminal; install the Debian package gnuplot-nox "
                             "(launch/setup.sh does) or pass --gnuplot PATH");
  const std::string terminal = terms.find("pngcairo") != std::string::npos ? "pngcairo" : "png";

  std::ifstream in(mpath);
  if (!in) throw std::runtime_error("cannot read " + mpath.string());
  std::string loss, evals, lr, tps;
  std::set<std::string> layer_set;
  std::vector<std::pair<double, json>> skips, skips_routable;  // of all tokens (α) / of the routable tokens
  bool any_routable = false;
  std::string line;
  int64_t n_train = 0, n_eval = 0, lineno = 0;
  std::vector<std::string> bad;  // "line N: why"
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      std::string what = e.what();
      if (auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);  // drop "[json.exception...]"
      bad.push_back("line " + std::to_string(lineno) + ": not JSON (" + what + ")");
      continue;
    }
    const double step = j.is_object() ? num(j, "step") : NAN;
    if (std::isnan(step)) {
      bad.push_back("line " + std::to_string(lineno) + ": " +
                    (j.is_object() ? "no numeric \"step\"" : "not a JSON object"));
      continue;
    }
    if (j.contains("eval")) {
      const json& e = j["eval"];
      evals += fmt(step) + " " + fmt(num(e, "loss")) + " " + fmt(num(e, "exact_match")) + "\n";
      ++n_eval;
      continue;
    }
    ++n_train;
    loss += fmt(step) + " " + fmt(num(j, "loss")) + " " + fmt(num(j, "lm_loss")) + " " + fmt(num(j, "routing_loss")) +
            "\n";
    lr += fmt(step) + " " + fmt(num(j, "lr")) + "\n";
    tps += fmt(step) + " " + fmt(num(j, "tokens_per_s")) + "\n";
    if (j.contains("skip_ratio") && j["skip_ratio"].is_object() && !j["skip_ratio"].empty()) {
      for (auto& [k, v] : j["skip_ratio"].items()) layer_set.insert(k);
      const json none = json::object();
      const bool has_r = j.contains("skip_ratio_routable") && j["skip_ratio_routable"].is_object();
      skips.emplace_back(step, j["skip_ratio"]);
      skips_routable.emplace_back(step, has_r ? j["skip_ratio_routable"] : none);
      any_routable = any_routable || (has_r && !j["skip_ratio_routable"].empty());
    }
  }
  if (!bad.empty()) {
    std::cerr << "gmod plot: warning: skipped " << bad.size() << " bad line(s) of " << mpath.string() << ":\n";
    for (size_t i = 0; i < bad.size() && i < 10; ++i) std::cerr << "  " << bad[i] << "\n";
    if (bad.size() > 10) std::cerr << "  ... and " << bad.size() - 10 << " more\n";
  }
  if (n_train == 0)
    throw std::runtime_error(mpath.string() + " has no training step line" +
                             (bad.empty() ? "" : " (" + std::to_string(bad.size()) + " bad line(s) skipped)"));
  fs::create_directories(out);
  std::vector<std::string> scripts;

  write_file(out / "loss.dat", "# step loss lm_loss routing_loss\n" + loss);
  std::string gp = header(terminal, "loss.png", "loss: " + mpath.string(), "loss") +
                   "plot 'loss.dat' using 1:2 with lines lw 2 title 'loss', \\\n"
                   "     'loss.dat' using 1:3 with lines lw 2 dt 2 title 'lm\\_loss', \\\n"
                   "     'loss.dat' using 1:4 with lines lw 2 title 'routing\\_loss'";
  if (n_eval > 0) {
    write_file(out / "eval.dat", "# step eval_loss exact_match\n" + evals);
    gp += ", \\\n     'eval.dat' using 1:2 with linespoints pt 7 ps 1.5 lw 2 title 'eval loss'";
  }
  write_file(out / "loss.gp", gp + "\n");
  scripts.push_back("loss");

  if (!layer_set.empty()) {
    std::vector<std::string> layers(layer_set.begin(), layer_set.end());
    std::sort(layers.begin(), layers.end(), [](const std::string& x, const std::string& y) {
      const long long a = std::strtoll(x.c_str(), nullptr, 10), b = std::strtoll(y.c_str(), nullptr, 10);
      return a != b ? a < b : x < y;  // layer numbers; a key that is not one cannot throw
    });
    // Columns: step, then per layer the skipped share of all tokens (α), then per layer that of the routable tokens.
    std::string dat = "# step";
    for (const auto& l : layers) dat += " layer_" + l;
    for (const auto& l : layers) dat += " layer_" + l + "_routable";
    dat += "\n";
    auto value = [](const json& sr, const std::string& l) {
      return sr.contains(l) && sr[l].is_number() ? fmt(sr[l].get<double>()) : std::string("NaN");
    };
    for (size_t r = 0; r < skips.size(); ++r) {
      dat += fmt(skips[r].first);
      for (const auto& l : layers) dat += " " + value(skips[r].second, l);
      for (const auto& l : layers) dat += " " + value(skips_routable[r].second, l);
      dat += "\n";
    }
    write_file(out / "skip_ratio.dat", dat);
    std::string s = header(terminal, "skip_ratio.png",
                           "skip ratio per MoD layer (solid: of all tokens, alpha; dashed: of routable tokens): " +
                               mpath.string(),
                           "skip ratio") +
                    "set yrange [0:*]\nplot ";
    for (size_t i = 0; i < layers.size(); ++i)
      s += std::string(i ? ", \\\n     " : "") + "'skip_ratio.dat' using 1:" + std::to_string(i + 2) +
           " with linespoints lw 2 lc " + std::to_string(i + 1) + " title 'layer " + layers[i] + " (all)'" +
           (any_routable ? ", \\\n     'skip_ratio.dat' using 1:" + std::to_string(i + 2 + layers.size()) +
                               " with lines lw 2 dt 2 lc " + std::to_string(i + 1) + " title 'layer " + layers[i] +
                               " (routable)'"
                         : std::string());
    write_file(out / "skip_ratio.gp", s + "\n");
    scripts.push_back("skip_ratio");
  }

  write_file(out / "lr.dat", "# step lr\n" + lr);
  write_file(out / "lr.gp", header(terminal, "lr.png", "learning rate: " + mpath.string(), "lr") +
                                "plot 'lr.dat' using 1:2 with lines lw 2 title 'lr'\n");
  scripts.push_back("lr");
  write_file(out / "throughput.dat", "# step tokens_per_s\n" + tps);
  write_file(out / "throughput.gp", header(terminal, "throughput.png", "throughput: " + mpath.string(), "tokens/s") +
                                        "set yrange [0:*]\nplot 'throughput.dat' using 1:2 with lines lw 2 title 'tokens/s'\n");
  scripts.push_back("throughput");

  for (const auto& name : scripts) {
    auto [grc, msg] =
        capture("cd " + shell_quote(out.string()) + " && " + shell_quote(gnuplot) + " " + name + ".gp");
    if (grc != 0 || !fs::exists(out / (name + ".png")))
      throw std::runtime_error("gnuplot failed on " + (out / (name + ".gp")).string() + ":\n" + msg);
    std::cout << "wrote " << (out / (name + ".png")).string() << "\n";
  }
  std::cout << "plotted " << n_train << " training steps and " << n_eval << " eval points from " << mpath.string()
            << " (terminal " << terminal << ")";
  if (!bad.empty()) std::cout << "; " << bad.size() << " bad line(s) skipped";
  std::cout << "\n";
  return 0;
}

Runner setup_plot(CLI::App& app) {
  auto o = std::make_shared<PlotOptions>();
  add(app, "--metrics", o->metrics, "a run's metrics.jsonl, or the run dir holding it")->type_name("PATH")->required();
  add(app, "--out", o->out, "folder of the PNGs, .dat and .gp files (default: RUN_DIR/plots)")->type_name("DIR");
  add(app, "--gnuplot", o->gnuplot, "the gnuplot program")->type_name("PATH");
  return [o] { return run_plot(*o); };
}

Register reg_plot({"plot", "PNG plots of a run's metrics.jsonl (loss, skip ratio, lr, tokens/s) with gnuplot",
                   setup_plot});

}  // namespace
}  // namespace gmod::cli

// `gmod report --config suite.json`: runs `gmod answer` then `gmod score` for every model and benchmark of a
// suite and writes the paper-style table (eval/report.h) as report.md, report.json and report.svg (average
// accuracy vs TFLOPs). Answers are reused when they are up to date (same answer command, newer than the
// question file and the model); --force answers again. Scores are always recomputed (they are cheap).
// docs/eval.md describes the suite file.
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "eval/records.h"
#include "eval/report.h"
#include "eval/score.h"
#include "launch/args.h"

namespace gmod::cli {
namespace {

namespace fs = std::filesystem;

struct ReportCliOptions {
  std::string config, out, gmod;
  bool force = false;
};

struct SuiteModel {
  std::string name, model;
  std::vector<std::string> args;
};

struct SuiteBenchmark {
  eval::ReportBenchmark b;
  std::string questions, images, format = "auto", score_questions, split;  // split "": the scorer's default
  std::vector<std::string> annotations, args;
};

struct Suite {
  std::string out;
  std::vector<std::string> launcher, answer_args;
  std::vector<SuiteModel> models;
  std::vector<SuiteBenchmark> benchmarks;
};

std::string slug(const std::string& name) {
  std::string s;
  for (unsigned char c : name) s += std::isalnum(c) ? static_cast<char>(std::tolower(c)) : '_';
  return s;
}

std::vector<std::string> strings(const eval::Json& j, const std::string& where) {
  std::vector<std::string> out;
  if (j.is_null()) return out;
  if (!j.is_array()) throw std::runtime_error(where + ": expected a list of strings");
  for (const eval::Json& v : j) {
    if (!v.is_string()) throw std::runtime_error(where + ": expected a list of strings");
    out.push_back(v.get<std::string>());
  }
  return out;
}

std::string str(const eval::Json& o, const char* key, const std::string& where, bool required,
                const std::string& fallback = "") {
  if (!o.contains(key) || o[key].is_null()) {
    if (required) throw std::runtime_error(where + ": no \"" + key + "\" (a string)");
    return fallback;
  }
  if (!o[key].is_string()) throw std::runtime_error(where + "." + key + ": not a string");
  return o[key].get<std::string>();
}

Suite read_suite(const std::string& path) {
  const eval::Json j = eval::read_json(path);
  if (!j.is_object()) throw std::runtime_error(path + ": not a JSON object");
  static const std::set<std::string> top = {"out", "launcher", "answer_args", "models", "benchmarks"};
  for (const auto& [k, v] : j.items())
    if (!top.count(k))
      throw std::runtime_error(path + ": unknown key \"" + k +
                               "\" (known: out, launcher, answer_args, models, benchmarks)");
  Suite s;
  s.out = str(j, "out", path, false);
  s.launcher = strings(j.value("launcher", eval::Json()), path + ".launcher");
  s.answer_args = strings(j.value("answer_args", eval::Json()), path + ".answer_args");
  if (!j.contains("models") || !j["models"].is_array() || j["models"].empty())
    throw std::runtime_error(path + ": \"models\" must be a non-empty list");
  if (!j.contains("benchmarks") || !j["benchmarks"].is_array() || j["benchmarks"].empty())
    throw std::runtime_error(path + ": \"benchmarks\" must be a non-empty list");
  std::set<std::string> seen;
  for (size_t i = 0; i < j["models"].size(); ++i) {
    const eval::Json& m = j["models"][i];
    const std::string w = path + ": models[" + std::to_string(i) + "]";
    if (!m.is_object()) throw std::runtime_error(w + ": not an object");
    SuiteModel sm{str(m, "name", w, true), str(m, "model", w, true),
                  strings(m.value("args", eval::Json()), w + ".args")};
    if (!seen.insert("m:" + slug(sm.name)).second)
      throw std::runtime_error(w + ": the name \"" + sm.name +
                               "\" is used twice (or differs only in punctuation)");
    s.models.push_back(sm);
  }
  for (size_t i = 0; i < j["benchmarks"].size(); ++i) {
    const eval::Json& b = j["benchmarks"][i];
    const std::string w = path + ": benchmarks[" + std::to_string(i) + "]";
    if (!b.is_object()) throw std::runtime_error(w + ": not an object");
    SuiteBenchmark sb;
    sb.b.name = str(b, "name", w, true);
    sb.b.scorer = str(b, "scorer", w, true);
    sb.b.figure = str(b, "figure", w, false);
    try {
      eval::headline(sb.b.scorer);
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(w + ": " + e.what());
    }
    sb.questions = str(b, "questions", w, true);
    sb.images = str(b, "images", w, false);
    sb.format = str(b, "format", w, false, "auto");
    sb.score_questions = str(b, "score_questions", w, false);
    sb.split = str(b, "split", w, false);  // given only where it applies (ScienceQA)
    sb.annotations = strings(b.value("annotations", eval::Json()), w + ".annotations");
    sb.args = strings(b.value("answer_args", eval::Json()), w + ".answer_args");
    if (!seen.insert("b:" + slug(sb.b.name)).second)
      throw std::runtime_error(w + ": the name \"" + sb.b.name +
                               "\" is used twice (or differs only in punctuation)");
    s.benchmarks.push_back(sb);
  }
  return s;
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Newest modification time of a file, or of a folder and its direct entries (a model dir's weights).
double newest_mtime(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return 0;
  double t = static_cast<double>(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec * 1e-9;
  if (S_ISDIR(st.st_mode)) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(path, ec)) {
      struct stat es {};
      if (stat(e.path().c_str(), &es) == 0)
        t = std::max(t, static_cast<double>(es.st_mtim.tv_sec) + es.st_mtim.tv_nsec * 1e-9);
    }
  }
  return t;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  if (!(f << text)) throw std::runtime_error(path + ": cannot write");
}

// Answers `b` with `m` into `dir` unless the answers there are up to date; returns "answered" or "reused".
std::string answer(const ReportCliOptions& o, const Suite& s, const SuiteModel& m, const SuiteBenchmark& b,
                   const std::string& dir, const std::string& answers, const std::string& stats) {
  std::vector<std::string> argv = s.launcher;
  argv.push_back(o.gmod);
  argv.push_back("answer");
  argv.insert(argv.end(), {"--model", m.model});
  argv.insert(argv.end(), m.args.begin(), m.args.end());
  argv.insert(argv.end(), s.answer_args.begin(), s.answer_args.end());
  argv.insert(argv.end(), b.args.begin(), b.args.end());
  argv.insert(argv.end(), {"--questions", b.questions, "--format", b.format, "--answers", answers, "--stats",
                           stats, "--model-id", m.name, "--allow-problems"});
  if (!b.images.empty()) argv.insert(argv.end(), {"--images", b.images});
  std::string cmd;
  for (const std::string& a : argv) cmd += (cmd.empty() ? "" : " ") + quote(a);
  const std::string cmd_file = dir + "/answer.cmd", log = dir + "/answer.log";
  const double t = newest_mtime(answers);
  if (!o.force && t > 0 && newest_mtime(stats) > 0 && read_text(cmd_file) == cmd + "\n" &&
      t >= newest_mtime(b.questions) && t >= newest_mtime(m.model))
    return "reused";
  std::remove(answers.c_str());
  std::remove(stats.c_str());
  std::remove(cmd_file.c_str());
  std::cout << "  gmod answer: " << m.name << " on " << b.b.name << " ... " << std::flush;
  const int rc = std::system((cmd + " > " + quote(log) + " 2>&1").c_str());
  if (rc != 0) {
    std::cout << "failed\n" << read_text(log);
    throw std::runtime_error("gmod answer for model \"" + m.name + "\" on benchmark \"" + b.b.name +
                             "\" failed (exit status " + std::to_string(rc) + "); its output: " + log);
  }
  write_text(cmd_file, cmd + "\n");
  std::cout << "done\n";
  return "answered";
}

int run_report(const ReportCliOptions& o0) {
  ReportCliOptions o = o0;
  const Suite s = read_suite(o.config);
  const std::string out = !o.out.empty() ? o.out : !s.out.empty() ? s.out : "report";
  if (o.gmod.empty()) {
    char buf[4096];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0)
      throw std::runtime_error("cannot find this gmod executable (/proc/self/exe); pass --gmod PATH");
    o.gmod.assign(buf, static_cast<size_t>(n));
  }
  eval::ReportInput in;
  for (const SuiteBenchmark& b : s.benchmarks) in.benchmarks.push_back(b.b);
  for (const SuiteModel& m : s.models) {
    in.models.push_back(m.name);
    in.cells.emplace_back();
    for (const SuiteBenchmark& b : s.benchmarks) {
      const std::string dir = out + "/" + slug(m.name) + "/" + slug(b.b.name);
      fs::create_directories(dir);
      // MMMU's scripts read a JSON list (output.json); the others JSON lines.
      const std::string answers = dir + (b.format == "mmmu" ? "/output.json" : "/answers.jsonl");
      const std::string stats = dir + "/answers.stats.json";
      const std::string how = answer(o, s, m, b, dir, answers, stats);
      eval::ScoreInputs si;
      si.answers = answers;
      si.annotations = b.annotations;
      si.questions = b.score_questions;
      si.split = b.split;
      eval::ScoreResult r;
      try {
        r = eval::score(b.b.scorer, si);
      } catch (const std::invalid_argument& e) {
        throw std::runtime_error(o.config + ": benchmark \"" + b.b.name + "\": " + e.what());
      }
      const eval::Json score = eval::score_json(r, si);
      write_text(dir + "/score.json", score.dump(2) + "\n");
      const eval::Json stats_json = eval::read_json(stats);
      const auto v =
          eval::figure_at(r.figures, b.b.figure.empty() ? eval::headline(b.b.scorer).figure : b.b.figure);
      std::printf("%-16s %-12s %s  %s = %s  (%zu record problem(s))\n", m.name.c_str(), b.b.name.c_str(),
                  how.c_str(),
                  b.b.figure.empty() ? eval::headline(b.b.scorer).figure.c_str() : b.b.figure.c_str(),
                  v ? std::to_string(*v).c_str() : "n/a", r.problems.size());
      in.cells.back().push_back({score, stats_json});
    }
  }
  const eval::Json report = eval::build_report(in);
  write_text(out + "/report.json", report.dump(2) + "\n");
  const std::string md = eval::report_markdown(report);
  write_text(out + "/report.md", md);
  write_text(out + "/report.svg", eval::report_svg(report));
  std::cout << "\n" << md << "\nwrote " << out << "/report.md, report.json, report.svg\n";
  return kExitOk;
}

Runner setup(CLI::App& app) {
  auto o = std::make_shared<ReportCliOptions>();
  add(app, "--config", o->config, "suite file (JSON: models, benchmarks; docs/eval.md)")
      ->type_name("FILE")
      ->required();
  add(app, "--out", o->out, "output folder (default: the suite's \"out\", else ./report)")->type_name("DIR");
  add_flag(app, "--force", o->force, "answer again even when the answers are up to date");
  add(app, "--gmod", o->gmod, "the gmod executable that answers (default: this one)")->type_name("PATH");
  return [o] { return run_report(*o); };
}

Register reg(
    {"report",
     "answer and score a suite of benchmarks for several models; the paper-style table (md, json, svg)",
     setup});

}  // namespace
}  // namespace gmod::cli

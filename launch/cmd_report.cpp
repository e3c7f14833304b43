// `gmod report --config suite.json`: runs `gmod answer` then `gmod score` for every model and benchmark of a
// suite and writes the paper-style table (eval/report.h) as report.md, report.json and report.svg (average
// accuracy vs TFLOPs). Answers are reused when they are up to date (same answer command, newer than the
// question file and the model); --force answers again. Scores are always recomputed (they are cheap).
// A suite may also make its models: "train" (`gmod train` from the suite's common training command, then
// `gmod export`) or "from" another model (its dir with other answer flags, or `gmod convert`ed from it), and
// time every model (`gmod answer --ignore-eos` at each batch size of "timing"); then the method table
// (eval/method_table.h) follows the paper-style one. Trainings and conversions are reused like answers;
// --retrain redoes them. docs/eval.md describes the suite file, docs/mod.md the method table.
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>

#include "eval/method_table.h"
#include "eval/records.h"
#include "eval/report.h"
#include "eval/score.h"
#include "launch/args.h"

namespace gmod::cli {
namespace {

namespace fs = std::filesystem;

struct ReportCliOptions {
  std::string config, out, gmod;
  bool force = false, retrain = false;
};

// A model is given ("model": a dir), trained ("train": arguments added to the suite's training command) or made
// from an earlier model ("from": its name; with "convert": `gmod convert` arguments, else its dir as it is). A
// "from" model answers with the earlier model's args, then its own.
struct SuiteModel {
  std::string name, model, from;
  std::vector<std::string> args, train, convert;
  bool trains = false, converts = false;
};

// The common training command of the "train" models: launcher + gmod train --config CONFIG ARGS + the model's
// own, with run_dir set to the model's folder under the suite's out.
struct SuiteTrain {
  std::string config;
  std::vector<std::string> launcher, args;
  int warmup_steps = 2;  // step lines left out of the training times
};

// The timing runs: the questions answered by every model at each batch size, generated to max_new_tokens past
// EOS, in one process (no launcher).
struct SuiteTiming {
  std::string questions, images, format = "auto";
  std::vector<int> batches = {1, 8};
  int64_t max_new_tokens = 16;
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
  std::optional<SuiteTrain> train;
  std::optional<SuiteTiming> timing;
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

void only_keys(const eval::Json& o, const std::string& where, const std::set<std::string>& known) {
  std::string list;
  for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
  for (const auto& [k, v] : o.items())
    if (!known.count(k)) throw std::runtime_error(where + ": unknown key \"" + k + "\" (known: " + list + ")");
}

SuiteTrain read_train(const eval::Json& t, const std::string& w) {
  if (!t.is_object()) throw std::runtime_error(w + ": not an object");
  only_keys(t, w, {"config", "launcher", "args", "warmup_steps"});
  SuiteTrain st;
  st.config = str(t, "config", w, true);
  st.launcher = strings(t.value("launcher", eval::Json()), w + ".launcher");
  st.args = strings(t.value("args", eval::Json()), w + ".args");
  if (t.contains("warmup_steps")) {
    if (!t["warmup_steps"].is_number_integer() || t["warmup_steps"].get<int64_t>() < 0)
      throw std::runtime_error(w + ".warmup_steps: not a non-negative integer");
    st.warmup_steps = t["warmup_steps"].get<int>();
  }
  return st;
}

SuiteTiming read_timing(const eval::Json& t, const std::string& w) {
  if (!t.is_object()) throw std::runtime_error(w + ": not an object");
  only_keys(t, w, {"questions", "images", "format", "batches", "max_new_tokens", "answer_args"});
  SuiteTiming st;
  st.questions = str(t, "questions", w, true);
  st.images = str(t, "images", w, false);
  st.format = str(t, "format", w, false, "auto");
  st.args = strings(t.value("answer_args", eval::Json()), w + ".answer_args");
  if (t.contains("batches")) {
    const eval::Json& b = t["batches"];
    if (!b.is_array() || b.empty()) throw std::runtime_error(w + ".batches: not a non-empty list of batch sizes");
    st.batches.clear();
    for (const eval::Json& v : b) {
      if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 4096)
        throw std::runtime_error(w + ".batches: " + v.dump() + " is not a batch size (an integer in [1, 4096])");
      st.batches.push_back(v.get<int>());
    }
  }
  if (t.contains("max_new_tokens")) {
    if (!t["max_new_tokens"].is_number_integer() || t["max_new_tokens"].get<int64_t>() < 2)
      throw std::runtime_error(w + ".max_new_tokens: not an integer >= 2 (a decode step needs a second token)");
    st.max_new_tokens = t["max_new_tokens"].get<int64_t>();
  }
  return st;
}

SuiteModel read_model(const eval::Json& m, const std::string& w, const Suite& s) {
  if (!m.is_object()) throw std::runtime_error(w + ": not an object");
  only_keys(m, w, {"name", "model", "args", "train", "from", "convert"});
  SuiteModel sm;
  sm.name = str(m, "name", w, true);
  sm.args = strings(m.value("args", eval::Json()), w + ".args");
  const int sources = int(m.contains("model")) + int(m.contains("train")) + int(m.contains("from"));
  if (sources != 1)
    throw std::runtime_error(w + " (\"" + sm.name + "\"): give exactly one of \"model\" (a dir), \"train\" (training "
                             "arguments) and \"from\" (an earlier model's name)");
  if (m.contains("convert") && !m.contains("from"))
    throw std::runtime_error(w + " (\"" + sm.name + "\"): \"convert\" converts the model named by \"from\"; give one");
  if (m.contains("model")) sm.model = str(m, "model", w, true);
  if (m.contains("train")) {
    if (!s.train) throw std::runtime_error(w + " (\"" + sm.name + "\"): \"train\" needs the suite's \"train\" (config)");
    sm.train = strings(m["train"], w + ".train");
    sm.trains = true;
  }
  if (m.contains("from")) {
    sm.from = str(m, "from", w, true);
    bool known = false;
    for (const SuiteModel& e : s.models) known = known || e.name == sm.from;
    if (!known) throw std::runtime_error(w + ".from: \"" + sm.from + "\" is not the name of an earlier model");
  }
  if (m.contains("convert")) {
    sm.convert = strings(m["convert"], w + ".convert");
    sm.converts = true;
  }
  return sm;
}

Suite read_suite(const std::string& path) {
  const eval::Json j = eval::read_json(path);
  if (!j.is_object()) throw std::runtime_error(path + ": not a JSON object");
  static const std::set<std::string> top = {"out",        "launcher", "answer_args", "models",
                                            "benchmarks", "train",    "timing"};
  for (const auto& [k, v] : j.items())
    if (!top.count(k))
      throw std::runtime_error(path + ": unknown key \"" + k +
                               "\" (known: out, launcher, answer_args, models, benchmarks, train, timing)");
  Suite s;
  s.out = str(j, "out", path, false);
  s.launcher = strings(j.value("launcher", eval::Json()), path + ".launcher");
  s.answer_args = strings(j.value("answer_args", eval::Json()), path + ".answer_args");
  if (!j.contains("models") || !j["models"].is_array() || j["models"].empty())
    throw std::runtime_error(path + ": \"models\" must be a non-empty list");
  if (!j.contains("benchmarks") || !j["benchmarks"].is_array() || j["benchmarks"].empty())
    throw std::runtime_error(path + ": \"benchmarks\" must be a non-empty list");
  if (j.contains("train")) s.train = read_train(j["train"], path + ".train");
  if (j.contains("timing")) s.timing = read_timing(j["timing"], path + ".timing");
  std::set<std::string> seen;
  for (size_t i = 0; i < j["models"].size(); ++i) {
    const std::string w = path + ": models[" + std::to_string(i) + "]";
    SuiteModel sm = read_model(j["models"][i], w, s);
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

// Removes `path` and everything under it (nothing when it is absent). nftw, not std::filesystem::remove_all: that
// one crashes next to libtorch.so (docs/engineering.md).
void remove_tree(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return;
  nftw(path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
       FTW_DEPTH | FTW_PHYS);
  if (lstat(path.c_str(), &st) == 0) throw std::runtime_error(path + ": cannot remove it (to make it again)");
}

std::string command_line(const std::vector<std::string>& argv) {
  std::string cmd;
  for (const std::string& a : argv) cmd += (cmd.empty() ? "" : " ") + shell_quote(a);
  return cmd;
}

// Runs `cmd` with its output in `log`; throws naming `what` and the log when it fails.
void run_logged(const std::string& cmd, const std::string& log, const std::string& what) {
  const int rc = std::system((cmd + " > " + shell_quote(log) + " 2>&1").c_str());
  if (rc != 0) {
    std::cout << "failed\n" << read_text(log);
    throw std::runtime_error(what + " failed (exit status " + std::to_string(rc) + "); its output: " + log);
  }
}

// Makes a "train" or "convert" model under out/<slug>/ unless it is up to date (the same commands, the product
// newer than what it was made from); returns the model as the answers see it (its dir, its answer args).
SuiteModel make_model(const ReportCliOptions& o, const Suite& s, const SuiteModel& m,
                      const std::vector<SuiteModel>& made, const std::string& out) {
  SuiteModel r = m;
  if (!m.from.empty()) {
    const SuiteModel* base = nullptr;
    for (const SuiteModel& e : made) base = e.name == m.from ? &e : base;
    r.args = base->args;
    r.args.insert(r.args.end(), m.args.begin(), m.args.end());
    r.model = base->model;
    if (!m.converts) return r;
  } else if (!m.trains) {
    return r;
  }
  const std::string dir = out + "/" + slug(m.name);
  fs::create_directories(dir);
  std::vector<std::pair<std::string, std::string>> steps;  // (command, what), run in order
  std::string product, input;
  if (m.trains) {
    const std::string run = dir + "/run";
    product = dir + "/hf";
    input = s.train->config;
    std::vector<std::string> argv = s.train->launcher;
    argv.insert(argv.end(), {o.gmod, "train", "--config", s.train->config});
    argv.insert(argv.end(), s.train->args.begin(), s.train->args.end());
    argv.insert(argv.end(), m.train.begin(), m.train.end());
    argv.insert(argv.end(), {"--set", "run_dir=" + run});
    steps.push_back({command_line(argv), "train"});
    steps.push_back({command_line({o.gmod, "export", "--checkpoint", run, "--out", product}), "export"});
  } else {
    product = dir + "/model";
    input = r.model;
    std::vector<std::string> argv = {o.gmod, "convert", "--model", r.model, "--out", product};
    argv.insert(argv.end(), m.convert.begin(), m.convert.end());
    steps.push_back({command_line(argv), "convert"});
  }
  std::string cmds;
  for (const auto& st : steps) cmds += st.first + "\n";
  const std::string cmd_file = dir + "/make.cmd";
  const double t = newest_mtime(product + "/config.json");
  r.model = product;
  if (!o.retrain && t > 0 && read_text(cmd_file) == cmds && t >= newest_mtime(input)) {
    std::cout << "  " << m.name << ": " << (m.trains ? "trained" : "converted") << " model reused (" << product
              << ")\n";
    return r;
  }
  std::remove(cmd_file.c_str());
  remove_tree(dir + "/run");
  remove_tree(product);
  for (const auto& [cmd, what] : steps) {
    std::cout << "  gmod " << what << ": " << m.name << " ... " << std::flush;
    const auto t0 = std::chrono::steady_clock::now();
    run_logged(cmd, dir + "/" + what + ".log", "gmod " + what + " for model \"" + m.name + "\"");
    std::printf("done (%.0f s)\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  write_text(cmd_file, cmds);
  return r;
}

// Answers `b` with `m` into `dir` unless the answers there are up to date; returns "answered" or "reused".
// `launcher` and `common` are the suite's (the timing runs go without them).
std::string answer(const ReportCliOptions& o, const std::vector<std::string>& launcher,
                   const std::vector<std::string>& common, const SuiteModel& m, const SuiteBenchmark& b,
                   const std::string& dir, const std::string& answers, const std::string& stats) {
  std::vector<std::string> argv = launcher;
  argv.push_back(o.gmod);
  argv.push_back("answer");
  argv.insert(argv.end(), {"--model", m.model});
  argv.insert(argv.end(), m.args.begin(), m.args.end());
  argv.insert(argv.end(), common.begin(), common.end());
  argv.insert(argv.end(), b.args.begin(), b.args.end());
  argv.insert(argv.end(), {"--questions", b.questions, "--format", b.format, "--answers", answers, "--stats",
                           stats, "--model-id", m.name, "--allow-problems"});
  if (!b.images.empty()) argv.insert(argv.end(), {"--images", b.images});
  const std::string cmd = command_line(argv);
  const std::string cmd_file = dir + "/answer.cmd", log = dir + "/answer.log";
  const double t = newest_mtime(answers);
  if (!o.force && t > 0 && newest_mtime(stats) > 0 && read_text(cmd_file) == cmd + "\n" &&
      t >= newest_mtime(b.questions) && t >= newest_mtime(m.model))
    return "reused";
  std::remove(answers.c_str());
  std::remove(stats.c_str());
  std::remove(cmd_file.c_str());
  std::cout << "  gmod answer: " << m.name << " on " << b.b.name << " ... " << std::flush;
  run_logged(cmd, log, "gmod answer for model \"" + m.name + "\" on \"" + b.b.name + "\"");
  write_text(cmd_file, cmd + "\n");
  std::cout << "done\n";
  return "answered";
}

// The timing runs of every model, then the method table (eval/method_table.h).
eval::Json method_table(const ReportCliOptions& o, const Suite& s, const std::vector<SuiteModel>& models,
                        const eval::Json& report, const std::string& out) {
  std::vector<eval::MethodRow> rows;
  std::vector<int> batches;
  if (s.timing) batches = s.timing->batches;
  for (size_t i = 0; i < models.size(); ++i) {
    const SuiteModel& m = models[i];
    eval::MethodRow row;
    row.name = m.name;
    row.average = report["models"][i]["average"];
    if (m.trains) row.train = eval::training_figures(out + "/" + slug(m.name) + "/run/metrics.jsonl",
                                                     s.train->warmup_steps);
    for (int B : batches) {
      SuiteBenchmark tb;
      tb.b.name = "timing b" + std::to_string(B);
      tb.questions = s.timing->questions;
      tb.images = s.timing->images;
      tb.format = s.timing->format;
      tb.args = s.timing->args;
      tb.args.insert(tb.args.end(), {"--batch", std::to_string(B), "--max-new-tokens",
                                     std::to_string(s.timing->max_new_tokens), "--ignore-eos"});
      const std::string dir = out + "/" + slug(m.name) + "/timing_b" + std::to_string(B);
      fs::create_directories(dir);
      const std::string stats = dir + "/answers.stats.json";
      const std::string how = answer(o, {}, {}, m, tb, dir, dir + "/answers.jsonl", stats);
      row.timing.push_back(eval::timing_figures(eval::read_json(stats), B));
      const eval::Json& t = row.timing.back();
      std::printf("%-16s %-12s %s  prefill %s ms, next token %s ms\n", m.name.c_str(), tb.b.name.c_str(),
                  how.c_str(), t["prefill_ms"].is_number() ? std::to_string(t["prefill_ms"].get<double>()).c_str() : "n/a",
                  t["next_token_ms"].is_number() ? std::to_string(t["next_token_ms"].get<double>()).c_str() : "n/a");
    }
    rows.push_back(row);
  }
  return eval::build_method_table(rows, batches);
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
  std::vector<SuiteModel> models;
  for (const SuiteModel& m : s.models) models.push_back(make_model(o, s, m, models, out));
  eval::ReportInput in;
  for (const SuiteBenchmark& b : s.benchmarks) in.benchmarks.push_back(b.b);
  for (const SuiteModel& m : models) {
    in.models.push_back(m.name);
    in.cells.emplace_back();
    for (const SuiteBenchmark& b : s.benchmarks) {
      const std::string dir = out + "/" + slug(m.name) + "/" + slug(b.b.name);
      fs::create_directories(dir);
      // MMMU's scripts read a JSON list (output.json); the others JSON lines.
      const std::string answers = dir + (b.format == "mmmu" ? "/output.json" : "/answers.jsonl");
      const std::string stats = dir + "/answers.stats.json";
      const std::string how = answer(o, s.launcher, s.answer_args, m, b, dir, answers, stats);
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
  eval::Json report = eval::build_report(in);
  std::string md = eval::report_markdown(report);
  if (s.train || s.timing) {
    report["methods"] = method_table(o, s, models, report, out);
    md += "\n## Methods\n\n" + eval::method_table_markdown(report["methods"]);
  }
  write_text(out + "/report.json", report.dump(2) + "\n");
  write_text(out + "/report.md", md);
  write_text(out + "/report.svg", eval::report_svg(report));
  std::cout << "\n" << md << "\nwrote " << out << "/report.md, report.json, report.svg\n";
  return kExitOk;
}

Runner setup_report(CLI::App& app) {
  auto o = std::make_shared<ReportCliOptions>();
  add(app, "--config", o->config, "suite file (JSON: models, benchmarks; docs/eval.md)")
      ->type_name("FILE")
      ->required();
  add(app, "--out", o->out, "output folder (default: the suite's \"out\", else ./report)")->type_name("DIR");
  add_flag(app, "--force", o->force, "answer again even when the answers are up to date");
  add_flag(app, "--retrain", o->retrain,
           "train and convert the suite's \"train\" and \"convert\" models again even when they are up to date");
  add(app, "--gmod", o->gmod, "the gmod executable that answers (default: this one)")->type_name("PATH");
  return [o] { return run_report(*o); };
}

Register reg_report(
    {"report",
     "answer and score a suite of benchmarks for several models; the paper-style table (md, json, svg)",
     setup_report});

}  // namespace
}  // namespace gmod::cli

// `gmod score`: score a benchmark's answer file with the benchmark's official rules (eval/score.h,
// docs/eval.md): VQA accuracy (TextVQA, VQAv2), GQA, ScienceQA, POPE, MME, MMBench (circular), MMMU. Prints
// the figures and every malformed, unmatched or repeated record and every option that does not apply by file
// and line; --json writes both, --per-question the value of each question.
#include <fstream>
#include <iostream>

#include "eval/score.h"
#include "launch/args.h"

namespace gmod::cli {
namespace {

struct ScoreCliOptions {
  std::string benchmark;
  eval::ScoreInputs in;
  std::string json;
  std::string per_question;
  bool allow_problems = false;
  int show = 20;
};

int run_score(const ScoreCliOptions& o) {
  eval::ScoreResult r;
  try {
    r = eval::score(o.benchmark, o.in);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  std::cout << o.benchmark << " (rule " << r.rule << "): " << o.in.answers << "\n";
  for (const std::string& l : r.lines) std::cout << l << "\n";
  if (!r.problems.empty()) {
    std::cout << r.problems.size()
              << " problem(s) (records not in the figures above unless said, options ignored):\n";
    for (size_t i = 0; i < r.problems.size() && static_cast<int>(i) < o.show; ++i)
      std::cout << "  " << r.problems[i].where << ": " << r.problems[i].what << "\n";
    if (static_cast<int>(r.problems.size()) > o.show)
      std::cout << "  ... and " << r.problems.size() - o.show << " more"
                << (o.json.empty() ? "" : " (all in --json)") << "\n";
  }
  if (!o.per_question.empty()) {
    std::ofstream f(o.per_question);
    for (const eval::Json& q : r.per_question) f << q.dump() << "\n";
    if (!f) throw std::runtime_error(o.per_question + ": cannot write");
    std::cout << "wrote " << o.per_question << " (" << r.per_question.size() << " questions)\n";
  }
  if (!o.json.empty()) {
    const eval::Json out = eval::score_json(r, o.in);
    if (o.json == "-") {
      std::cout << out.dump(2) << "\n";
    } else {
      std::ofstream f(o.json);
      if (!(f << out.dump(2) << "\n")) throw std::runtime_error(o.json + ": cannot write");
      std::cout << "wrote " << o.json << "\n";
    }
  }
  if (!r.problems.empty() && !o.allow_problems) {
    std::cerr << "gmod score: " << r.problems.size()
              << " problem(s); fix the files or options, or pass --allow-problems to accept the figures\n";
    return kExitRuntime;
  }
  return kExitOk;
}

Runner setup_score(CLI::App& app) {
  auto o = std::make_shared<ScoreCliOptions>();
  add(app, "benchmark", o->benchmark, "textvqa, vqav2, gqa, scienceqa, pope, mme, mmbench or mmmu")
      ->type_name("BENCHMARK")
      ->required()
      ->check(CLI::IsMember(eval::benchmark_names()));
  add(app, "--answers", o->in.answers,
      "the model's answers (the jsonl LLaVA's answering scripts write; MMMU: its output.json, or the "
      "{id: prediction} file of γ-MoD's model_mmmu.py with --annotations answer_dict_val.json)")
      ->type_name("FILE")
      ->required();
  add(app, "--annotations", o->in.annotations,
      "ground truth: a file or folder, repeat for several (per benchmark: docs/eval.md)")
      ->type_name("PATH");
  add(app, "--questions", o->in.questions,
      "the question file (POPE: the jsonl, question_id -> category; VQAv2 with VQAEval: the question json)")
      ->type_name("FILE");
  add(app, "--split", o->in.split, "ScienceQA split in pid_splits.json (default test)");
  add(app, "--rule", o->in.rule,
      "the scoring rule (default: the script behind the γ-MoD paper's table): vqav2 vqaeval|m4c, scienceqa "
      "gamma-mod|llava (docs/eval.md)")
      ->type_name("RULE");
  add(app, "--per-question", o->per_question,
      "write per question {id, prediction, processed, parsed, score, ...} as JSON lines to this file")
      ->type_name("FILE");
  add(app, "--json", o->json, "write figures and problems as JSON to this file (- = stdout)")
      ->type_name("FILE");
  add_flag(
      app, "--allow-problems", o->allow_problems,
      "exit 0 even when records are malformed, unmatched, missing or repeated, or an option does not apply "
      "(all are listed either way)");
  add(app, "--show", o->show, "problems to list on the terminal at most")->check(non_negative());
  return [o] { return run_score(*o); };
}

Register reg_score(
    {"score",
     "score a benchmark's answer file with its official rules (VQA, GQA, SQA, POPE, MME, MMBench, MMMU)",
     setup_score});

}  // namespace
}  // namespace gmod::cli

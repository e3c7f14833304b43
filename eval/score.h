// `gmod score`: score a benchmark's answer file with the benchmark's official rules (docs/eval.md). The
// inputs every scorer takes, the result every scorer returns (named figures, terminal lines, and the problems
// found in the records, each named), and the dispatch by benchmark name.
#pragma once

#include <string>
#include <vector>

#include "eval/records.h"

namespace gmod::eval {

struct ScoreInputs {
  std::string answers;  // the model's answer file (as the original answering scripts write it)
  std::vector<std::string> annotations;  // ground truth files (per benchmark: docs/eval.md)
  std::string questions;  // the question file, where the benchmark needs it (POPE's categories)
  std::string split;      // ScienceQA's split in pid_splits.json ("" = test)
  std::string rule;       // the scoring rule where a benchmark has several ("" = its default, docs/eval.md)
};

struct ScoreResult {
  std::string benchmark;
  std::string rule;                // the rule it was scored with (rule_names)
  Json figures = Json::object();   // the benchmark's figures, named as its original names them
  std::vector<std::string> lines;  // what the terminal shows
  std::vector<Problem> problems;   // malformed or unmatched records, each named; never silently dropped
  // Per question, in the order the original scores them: {id, prediction (as given), processed (the
  // prediction as the rule compares it), parsed (the answer read from it, where the rule reads one), score,
  // ...} (`gmod score --per-question`).
  Json per_question = Json::array();
};

// The benchmarks `score` knows: textvqa, vqav2, gqa, scienceqa, pope, mme, mmbench, mmmu.
const std::vector<std::string>& benchmark_names();
// The rules a benchmark can be scored with, its default first (vqav2: vqaeval, m4c; scienceqa: gamma-mod,
// llava; the others: one, named after the script).
const std::vector<std::string>& rule_names(const std::string& benchmark);
// Scores `benchmark`; throws std::invalid_argument for an unknown name or missing inputs, std::runtime_error
// for a file that cannot be read at all. An answer record that `gmod answer` marked as not answered (its
// metadata.problem, eval/questions.h) is scored as the empty answer it holds, as the original scorers do, and
// also named among the problems.
ScoreResult score(const std::string& benchmark, const ScoreInputs& in);
// What `gmod score --json` writes: {benchmark, rule, answers, annotations, [questions], figures,
// problem_count, problems: [{where, what}]}.
Json score_json(const ScoreResult& r, const ScoreInputs& in);

// Helpers shared by the scorers.
void require_inputs(const ScoreInputs& in, const std::string& benchmark, size_t annotations, bool questions);
// The rule `in` asks for (its default when none); throws std::invalid_argument for one the benchmark lacks.
std::string rule_of(const ScoreInputs& in, const std::string& benchmark);
// A problem for an option given that the benchmark (with this rule) does not use: named, not ignored.
void option_does_not_apply(const std::string& option, const std::string& why, std::vector<Problem>* problems);
std::string percent(double fraction);  // "12.34%"

}  // namespace gmod::eval

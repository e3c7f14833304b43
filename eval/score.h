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
  std::string questions;       // the question file, where the benchmark needs it (POPE's categories)
  std::string split = "test";  // ScienceQA's split in pid_splits.json
};

struct ScoreResult {
  std::string benchmark;
  Json figures = Json::object();   // the benchmark's figures, named as its original names them
  std::vector<std::string> lines;  // what the terminal shows
  std::vector<Problem> problems;   // malformed or unmatched records, each named; never silently dropped
};

// The benchmarks `score` knows: textvqa, vqav2, gqa, scienceqa, pope, mme, mmbench, mmmu.
const std::vector<std::string>& benchmark_names();
// Scores `benchmark`; throws std::invalid_argument for an unknown name or missing inputs, std::runtime_error
// for a file that cannot be read at all. An answer record that `gmod answer` marked as not answered (its
// metadata.problem, eval/questions.h) is scored as the empty answer it holds, as the original scorers do, and
// also named among the problems.
ScoreResult score(const std::string& benchmark, const ScoreInputs& in);
// What `gmod score --json` writes: {benchmark, answers, annotations, [questions], figures, problem_count,
// problems: [{where, what}]}.
Json score_json(const ScoreResult& r, const ScoreInputs& in);

// Helpers shared by the scorers.
void require_inputs(const ScoreInputs& in, const std::string& benchmark, size_t annotations, bool questions);
std::string percent(double fraction);  // "12.34%"

}  // namespace gmod::eval

// Dispatch of `gmod score` by benchmark name (see score.h).
#include "eval/score.h"

#include <cstdio>
#include <stdexcept>

#include "eval/questions.h"
#include "eval/score_gqa.h"
#include "eval/score_mmbench.h"
#include "eval/score_mme.h"
#include "eval/score_mmmu.h"
#include "eval/score_pope.h"
#include "eval/score_scienceqa.h"
#include "eval/score_vqa.h"

namespace gmod::eval {

const std::vector<std::string>& benchmark_names() {
  static const std::vector<std::string> names = {"textvqa", "vqav2", "gqa",     "scienceqa",
                                                 "pope",    "mme",   "mmbench", "mmmu"};
  return names;
}

ScoreResult score(const std::string& benchmark, const ScoreInputs& in) {
  ScoreResult r;
  if (benchmark == "textvqa")
    r = score_textvqa(in);
  else if (benchmark == "vqav2")
    r = score_vqav2(in);
  else if (benchmark == "gqa")
    r = score_gqa(in);
  else if (benchmark == "scienceqa")
    r = score_scienceqa(in);
  else if (benchmark == "pope")
    r = score_pope(in);
  else if (benchmark == "mme")
    r = score_mme(in);
  else if (benchmark == "mmbench")
    r = score_mmbench(in);
  else if (benchmark == "mmmu")
    r = score_mmmu(in);
  else
    throw std::invalid_argument("unknown benchmark '" + benchmark + "'");
  r.benchmark = benchmark;
  std::vector<Problem> ignored;  // the scorer has named the malformed records already
  for (const Record& rec : read_records(in.answers, &ignored))
    if (const std::string p = answer_problem(rec.value); !p.empty())
      r.problems.push_back({rec.where, "not answered (" + p + "); scored as the empty answer it holds"});
  sort_problems(&r.problems);
  return r;
}

Json score_json(const ScoreResult& r, const ScoreInputs& in) {
  Json out = {{"benchmark", r.benchmark}, {"answers", in.answers}, {"annotations", in.annotations}};
  if (!in.questions.empty()) out["questions"] = in.questions;
  out["figures"] = r.figures;
  out["problem_count"] = r.problems.size();
  out["problems"] = Json::array();
  for (const auto& p : r.problems) out["problems"].push_back({{"where", p.where}, {"what", p.what}});
  return out;
}

void require_inputs(const ScoreInputs& in, const std::string& benchmark, size_t annotations, bool questions) {
  if (in.answers.empty()) throw std::invalid_argument(benchmark + ": --answers is required");
  if (annotations && in.annotations.size() < annotations)
    throw std::invalid_argument(benchmark + ": needs " + std::to_string(annotations) +
                                " --annotations file(s), got " + std::to_string(in.annotations.size()));
  if (questions && in.questions.empty()) throw std::invalid_argument(benchmark + ": --questions is required");
}

std::string percent(double fraction) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f%%", 100.0 * fraction);
  return buf;
}

}  // namespace gmod::eval

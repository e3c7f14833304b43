// Dispatch of `gmod score` by benchmark name (see score.h).
#include "eval/score.h"

#include <cstdio>
#include <map>
#include <stdexcept>

#include "eval/questions.h"
#include "eval/score_gqa.h"
#include "eval/score_mmbench.h"
#include "eval/score_mme.h"
#include "eval/score_mmmu.h"
#include "eval/score_pope.h"
#include "eval/score_scienceqa.h"
#include "eval/score_vqa.h"
#include "eval/unicode_age.h"

namespace gmod::eval {

const std::vector<std::string>& benchmark_names() {
  static const std::vector<std::string> names = {"textvqa", "vqav2", "gqa",     "scienceqa",
                                                 "pope",    "mme",   "mmbench", "mmmu"};
  return names;
}

const std::vector<std::string>& rule_names(const std::string& benchmark) {
  static const std::map<std::string, std::vector<std::string>> rules = {
      {"textvqa", {"m4c"}},     {"vqav2", {"vqaeval", "m4c"}},
      {"gqa", {"gqa"}},         {"scienceqa", {"gamma-mod", "llava"}},
      {"pope", {"llava"}},      {"mme", {"mme"}},
      {"mmbench", {"mmbench"}}, {"mmmu", {"mmmu"}}};
  const auto it = rules.find(benchmark);
  if (it == rules.end()) throw std::invalid_argument("unknown benchmark '" + benchmark + "'");
  return it->second;
}

std::string rule_of(const ScoreInputs& in, const std::string& benchmark) {
  const std::vector<std::string>& names = rule_names(benchmark);
  if (in.rule.empty()) return names[0];
  for (const std::string& n : names)
    if (n == in.rule) return n;
  std::string known;
  for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument(benchmark + ": unknown --rule '" + in.rule + "' (known: " + known + ")");
}

void option_does_not_apply(const std::string& option, const std::string& why,
                           std::vector<Problem>* problems) {
  problems->push_back({option, "does not apply: " + why + " (ignored)"});
}

ScoreResult score(const std::string& benchmark, const ScoreInputs& in) {
  ScoreResult r;
  const std::string rule = rule_of(in, benchmark);
  std::vector<Problem> options;  // options given that the benchmark does not read
  if (!in.split.empty() && benchmark != "scienceqa")
    option_does_not_apply("--split", benchmark + " has no split to choose (ScienceQA's pid_splits.json)",
                          &options);
  const bool reads_questions = benchmark == "pope" || (benchmark == "vqav2" && rule == "vqaeval");
  if (!in.questions.empty() && !reads_questions)
    option_does_not_apply("--questions",
                          benchmark + (benchmark == "vqav2" ? " with --rule " + rule : std::string()) +
                              " reads no question file",
                          &options);
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
  r.problems.insert(r.problems.end(), options.begin(), options.end());
  // the one difference left (eval/unicode_age.h): characters newer than the originals' Python, per file
  report_newer_unicode(in.answers, &r.problems);
  for (const std::string& a : in.annotations) report_newer_unicode(a, &r.problems);
  if (!in.questions.empty()) report_newer_unicode(in.questions, &r.problems);
  r.rule = rule;
  std::vector<Problem> ignored;  // the scorer has named the malformed records already
  for (const Record& rec : read_records(in.answers, &ignored))
    if (const std::string p = answer_problem(rec.value); !p.empty())
      r.problems.push_back({rec.where, "not answered (" + p + "); scored as the empty answer it holds"});
  sort_problems(&r.problems);
  return r;
}

Json score_json(const ScoreResult& r, const ScoreInputs& in) {
  Json out = {
      {"benchmark", r.benchmark}, {"rule", r.rule}, {"answers", in.answers}, {"annotations", in.annotations}};
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

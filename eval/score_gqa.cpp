// GQA exact-match accuracy (see score_gqa.h).
#include "eval/score_gqa.h"

#include <map>
#include <set>

#include "eval/answer_ids.h"
#include "eval/pystr.h"

namespace gmod::eval {

ScoreResult score_gqa(const ScoreInputs& in) {
  require_inputs(in, "gqa", 1, false);
  ScoreResult r;
  const Json questions = read_json(in.annotations[0]);
  if (!questions.is_object())
    throw std::runtime_error(in.annotations[0] + ": not a JSON object of questions (GQA's questions file)");
  std::map<std::string, std::string>
      predictions;  // question id -> converted prediction (the last answer wins)
  std::map<std::string, std::string> where;
  // convert_gqa_for_eval.py keeps every line; GQA's eval.py reads them into {questionId: prediction}
  AnswerIds seen("GQA's eval.py", Repeats::kLastWins);
  for (const Record& rec : read_jsonl(in.answers, &r.problems)) {
    const auto it = rec.value.find("question_id");
    const std::string* text = string_field(rec, "text", &r.problems);
    if (it == rec.value.end() || !it->is_string()) {
      r.problems.push_back({rec.where, "no string 'question_id' (GQA's question ids are strings)"});
      continue;
    }
    if (!text) continue;
    seen.add(it->get<std::string>(), it->get<std::string>(), rec.where, &r.problems);
    predictions[it->get<std::string>()] = py::lower(py::rstrip_chars(*text, "."));
    where[it->get<std::string>()] = rec.where;
  }
  int64_t total = 0, correct = 0;
  std::map<std::string, std::pair<int64_t, int64_t>> by_type;  // structural type -> (correct, total)
  std::set<std::string> asked;
  for (const auto& [qid, q] : questions.items()) {
    const std::string at = in.annotations[0] + "[" + qid + "]";
    if (!q.is_object() || !q.contains("answer") || !q["answer"].is_string()) {
      r.problems.push_back({at, "no string 'answer'"});
      continue;
    }
    asked.insert(qid);
    std::string type = "unknown";
    if (q.contains("types") && q["types"].is_object() && q["types"].contains("structural") &&
        q["types"]["structural"].is_string())
      type = q["types"]["structural"].get<std::string>();
    const auto p = predictions.find(qid);
    const bool hit = p != predictions.end() && p->second == q["answer"].get<std::string>();
    if (p == predictions.end()) r.problems.push_back({at, "no answer for this question (counted as wrong)"});
    ++total, correct += hit;
    ++by_type[type].second, by_type[type].first += hit;
    r.per_question.push_back({{"id", qid},
                              {"processed", p == predictions.end() ? Json() : Json(p->second)},
                              {"answer", q["answer"]},
                              {"score", hit ? 1 : 0}});
  }
  for (const auto& [qid, w] : where)
    if (!asked.count(qid))
      r.problems.push_back({w, "question_id " + qid + " is not in " + in.annotations[0]});
  const double acc = total ? static_cast<double>(correct) / static_cast<double>(total) : 0.0;
  r.figures["questions"] = total;
  r.figures["correct"] = correct;
  r.figures["accuracy"] = acc;
  Json types = Json::object();
  for (const auto& [t, ct] : by_type)
    types[t] = {{"questions", ct.second},
                {"accuracy", static_cast<double>(ct.first) / static_cast<double>(ct.second)}};
  r.figures["structural"] = types;
  r.lines.push_back("questions  " + std::to_string(total));
  r.lines.push_back("accuracy   " + percent(acc) + " (" + std::to_string(correct) + " exact matches)");
  for (const auto& [t, ct] : by_type)
    r.lines.push_back("  " + t + "  " +
                      percent(static_cast<double>(ct.first) / static_cast<double>(ct.second)) + " of " +
                      std::to_string(ct.second));
  return r;
}

}  // namespace gmod::eval

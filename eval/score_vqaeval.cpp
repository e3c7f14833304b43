// VQAv2 with VQAEval (see score_vqaeval.h).
#include "eval/score_vqaeval.h"

#include <cmath>
#include <map>
#include <set>

#include "eval/answer_ids.h"
#include "eval/pystr.h"
#include "eval/vqa_normalize.h"

namespace gmod::eval {
namespace {

const char* const kVqaScript = "VQAEval (vqa.py/vqa_eval.py)";

bool py_number(const Json& j, double* out) {
  if (j.is_boolean()) return *out = j.get<bool>() ? 1 : 0, true;
  if (j.is_number()) return *out = j.get<double>(), true;
  return false;
}

// A mean as VQAEval's setAccuracy: round(100 * float(sum(xs)) / len(xs), 2), summed left to right.
double rounded_mean(const std::vector<double>& xs) {
  double s = 0;
  for (double x : xs) s += x;
  return py::round2(100 * s / static_cast<double>(xs.size()));
}

struct Question {
  std::string key, shown, where;
  Json answers;  // the answer dicts, processed in place as evaluate does
  std::string question_type, answer_type;
  bool usable = false;
};

}  // namespace

bool py_equal(const Json& a, const Json& b) {
  double x = 0, y = 0;
  if (py_number(a, &x) && py_number(b, &y)) return x == y;
  if (a.is_object() && b.is_object()) {
    if (a.size() != b.size()) return false;
    for (const auto& [k, v] : a.items())
      if (!b.contains(k) || !py_equal(v, b[k])) return false;
    return true;
  }
  if (a.is_array() && b.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!py_equal(a[i], b[i])) return false;
    return true;
  }
  return a.type() == b.type() && a == b;
}

std::string vqaeval_prediction(const std::string& answer) {
  const std::string s = py::strip(py::replace(py::replace(answer, "\n", " "), "\t", " "));
  return vqa_process_digit_article(vqa_process_punctuation(s, VqaCommaRule::kVqaEval));
}

ScoreResult score_vqav2_vqaeval(const ScoreInputs& in) {
  require_inputs(in, "vqav2", 1, false);
  ScoreResult r;
  const std::string& ann_path = in.annotations[0];
  const Json doc = read_json(ann_path);
  if (!doc.is_object() || !doc.contains("annotations") || !doc["annotations"].is_array())
    throw std::runtime_error(ann_path + ": no 'annotations' list (a VQA v2 annotation file)");
  // quesIds: the annotations' question ids in order (a repeated one is evaluated again, with the last record)
  std::vector<std::string> order;
  std::map<std::string, Question> qa;
  const Json& anns = doc["annotations"];
  for (size_t i = 0; i < anns.size(); ++i) {
    const std::string where = ann_path + "[annotations #" + std::to_string(i) + "]";
    const Json& a = anns[i];
    const std::string key = a.is_object() && a.contains("question_id") ? id_key(a["question_id"]) : "";
    if (key.empty()) {
      r.problems.push_back({where, "no 'question_id' (a string or a number): the original stops (KeyError)"});
      continue;
    }
    Question q{key, id_text(a["question_id"]), where, Json(), "", "", false};
    if (qa.count(key))
      r.problems.push_back({where, "question_id " + q.shown + " again (first at " + qa[key].where +
                                       "): VQAEval scores this last record once per listing"});
    const bool types = a.contains("question_type") && a["question_type"].is_string() &&
                       a.contains("answer_type") && a["answer_type"].is_string();
    bool answers_ok = a.contains("answers") && a["answers"].is_array() && !a["answers"].empty();
    for (const Json& x : answers_ok ? a["answers"] : Json::array())
      answers_ok = answers_ok && x.is_object() && x.contains("answer") && x["answer"].is_string();
    if (!types)
      r.problems.push_back(
          {where, "no string 'question_type' and 'answer_type': the original stops (KeyError)"});
    else if (!answers_ok)
      r.problems.push_back({where,
                            "no non-empty 'answers' list of {answer: string} records: the original "
                            "stops (KeyError/ZeroDivisionError)"});
    if (types && answers_ok) {
      q.answers = a["answers"];
      q.question_type = a["question_type"].get<std::string>();
      q.answer_type = a["answer_type"].get<std::string>();
      q.usable = true;
    }
    order.push_back(key);
    qa[key] = std::move(q);
  }
  // --questions, as loadRes reads it
  std::map<std::string, Json> choices;  // Multiple Choice: question id -> multiple_choices
  if (!in.questions.empty()) {
    const Json qs = read_json(in.questions);
    for (const char* k : {"info", "task_type", "data_type", "data_subtype", "license", "questions"})
      if (!qs.is_object() || !qs.contains(k))
        throw std::runtime_error(in.questions + ": no '" + k +
                                 "' (a VQA question file; loadRes stops here with KeyError)");
    if (qs["task_type"] == "Multiple Choice" && qs["questions"].is_array())
      for (const Json& q : qs["questions"])
        if (q.is_object() && q.contains("question_id") && q.contains("multiple_choices"))
          choices[id_key(q["question_id"])] = q["multiple_choices"];
  }
  // the answers: the last line of a question counts (loadRes's createIndex)
  std::map<std::string, std::pair<std::string, std::string>> res;  // key -> (text, where)
  AnswerIds seen(kVqaScript, Repeats::kLastWins);
  for (const Record& rec : read_jsonl(in.answers, &r.problems)) {
    const std::string key = id_key(rec, "question_id", &r.problems);
    const std::string* text = string_field(rec, "text", &r.problems);
    if (key.empty() || !text) continue;
    if (!qa.count(key)) {
      r.problems.push_back({rec.where, "question_id " + id_text(rec.value["question_id"]) + " is not in " +
                                           ann_path +
                                           " (VQA.loadRes asserts the answers are its questions)"});
      continue;
    }
    if (!choices.empty()) {
      const auto c = choices.find(key);
      bool listed = false;
      for (const Json& x : c == choices.end() ? Json::array() : c->second) listed = listed || x == *text;
      if (!listed)
        r.problems.push_back({rec.where, "not one of the question's multiple_choices (loadRes asserts it)"});
    }
    seen.add(key, id_text(rec.value["question_id"]), rec.where, &r.problems);
    res[key] = {*text, rec.where};
  }
  std::vector<double> acc_qa;
  std::vector<std::string> qtype_order, atype_order;
  std::map<std::string, std::vector<double>> acc_qtype, acc_atype;
  for (const std::string& key : order) {
    Question& q = qa[key];
    const auto p = res.find(key);
    if (p == res.end()) {
      r.problems.push_back({q.where, "question_id " + q.shown +
                                         " has no answer (VQA.loadRes asserts every question is answered)"});
      continue;
    }
    if (!q.usable) continue;
    const std::string pred = vqaeval_prediction(p->second.first);
    std::set<std::string> distinct;
    for (const Json& a : q.answers) distinct.insert(a["answer"].get<std::string>());
    if (distinct.size() > 1)
      for (Json& a : q.answers)
        a["answer"] = vqa_process_punctuation(a["answer"].get<std::string>(), VqaCommaRule::kVqaEval);
    double sum = 0;
    for (const Json& gt : q.answers) {
      int matching = 0;
      for (const Json& other : q.answers)
        matching += !py_equal(other, gt) && other["answer"].get<std::string>() == pred;
      sum += std::min(1.0, static_cast<double>(matching) / 3);
    }
    const double acc = sum / static_cast<double>(q.answers.size());
    acc_qa.push_back(acc);
    if (!acc_qtype.count(q.question_type)) qtype_order.push_back(q.question_type);
    if (!acc_atype.count(q.answer_type)) atype_order.push_back(q.answer_type);
    acc_qtype[q.question_type].push_back(acc);
    acc_atype[q.answer_type].push_back(acc);
    r.per_question.push_back({{"id", q.shown},
                              {"prediction", p->second.first},
                              {"processed", pred},
                              {"score", acc},
                              {"score_rounded", py::round2(100 * acc)},
                              {"question_type", q.question_type},
                              {"answer_type", q.answer_type}});
  }
  double total = 0;
  for (double x : acc_qa) total += x;
  r.figures["samples"] = acc_qa.size();
  r.figures["accuracy"] = acc_qa.empty() ? Json() : Json(total / static_cast<double>(acc_qa.size()));
  r.figures["overall"] = acc_qa.empty() ? Json() : Json(rounded_mean(acc_qa));
  Json per_q = Json::object(), per_a = Json::object();
  for (const std::string& t : qtype_order) per_q[t] = rounded_mean(acc_qtype[t]);
  for (const std::string& t : atype_order) per_a[t] = rounded_mean(acc_atype[t]);
  r.figures["perQuestionType"] = per_q;
  r.figures["perAnswerType"] = per_a;
  char buf[96];
  r.lines.push_back("samples   " + std::to_string(acc_qa.size()));
  if (acc_qa.empty()) {
    r.lines.push_back("overall   n/a (no answered question: VQAEval divides by zero)");
    r.problems.push_back(
        {in.answers, "no answered question of " + ann_path + ": VQAEval stops (ZeroDivisionError)"});
    return r;
  }
  std::snprintf(buf, sizeof buf, "overall   %.2f", r.figures["overall"].get<double>());
  r.lines.push_back(buf);
  r.lines.push_back("per answer type:");
  for (const std::string& t : atype_order)
    std::snprintf(buf, sizeof buf, "  %-20s %.2f", t.c_str(), per_a[t].get<double>()), r.lines.push_back(buf);
  r.lines.push_back("per question type:");
  for (const std::string& t : qtype_order)
    std::snprintf(buf, sizeof buf, "  %-20s %.2f", t.c_str(), per_q[t].get<double>()), r.lines.push_back(buf);
  return r;
}

}  // namespace gmod::eval

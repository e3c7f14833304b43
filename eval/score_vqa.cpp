// TextVQA and VQAv2 soft accuracy (see score_vqa.h).
#include "eval/score_vqa.h"

#include <algorithm>
#include <map>
#include <set>

#include "eval/answer_ids.h"
#include "eval/pystr.h"
#include "eval/regex.h"
#include "eval/score_vqaeval.h"
#include "eval/vqa_normalize.h"

namespace gmod::eval {
namespace {

struct Pred {
  std::string text;
  std::vector<std::string> gt;  // raw human answers
  std::string id;               // as written
};

// Normalises and scores the predictions in order; fills figures, lines and the per-question values.
void finish(ScoreResult& r, const std::vector<Pred>& preds) {
  double sum = 0;
  for (const Pred& p : preds) {
    std::vector<std::string> gt;
    for (const std::string& a : p.gt) gt.push_back(normalize_vqa_answer(a));
    const std::string processed = normalize_vqa_answer(p.text);
    const double score = vqa_soft_score(processed, gt);
    sum += score;
    r.per_question.push_back(
        {{"id", p.id}, {"prediction", p.text}, {"processed", processed}, {"score", score}});
  }
  const double acc = preds.empty() ? 0.0 : sum / static_cast<double>(preds.size());
  r.figures["samples"] = preds.size();
  r.figures["accuracy"] = acc;
  r.lines.push_back("samples   " + std::to_string(preds.size()));
  r.lines.push_back("accuracy  " + percent(acc));
}

// The 10 answer strings of an annotation record's `field` (strings, or objects with "answer"), or a problem.
bool ten_answers(const Json& list, const std::string& where, std::vector<std::string>* out,
                 std::vector<Problem>* problems) {
  out->clear();
  if (!list.is_array()) return problems->push_back({where, "no 'answers' list"}), false;
  for (const Json& a : list) {
    if (a.is_string())
      out->push_back(a.get<std::string>());
    else if (a.is_object() && a.contains("answer") && a["answer"].is_string())
      out->push_back(a["answer"].get<std::string>());
    else
      return problems->push_back({where, "an answer that is not a string"}), false;
  }
  if (out->size() != 10)
    return problems->push_back(
               {where, std::to_string(out->size()) + " human answers, the VQA score needs 10"}),
           false;
  return true;
}

}  // namespace

double vqa_soft_score(const std::string& pred, const std::vector<std::string>& gt) {
  if (std::find(gt.begin(), gt.end(), pred) == gt.end()) return 0.0;
  double sum = 0;
  for (size_t i = 0; i < gt.size(); ++i) {  // leave answer i out
    int matches = 0;
    for (size_t j = 0; j < gt.size(); ++j) matches += j != i && gt[j] == pred;
    sum += std::min(1.0, static_cast<double>(matches) / 3);
  }
  return sum / static_cast<double>(gt.size());
}

bool textvqa_question(const std::string& prompt, std::string* question) {
  static const Regex ocr_question("Question: (.*?) Short answer:", /*dotall=*/true);
  const std::vector<std::string> lines = py::split(prompt, "\n");
  if (prompt.rfind("OCR tokens: ", 0) == 0) {
    const auto q = ocr_question.search_group(prompt, 1);
    if (!q) return false;
    *question = *q;
  } else if (prompt.find("Reference OCR token: ") != std::string::npos && lines.size() == 3) {
    *question = prompt.rfind("Reference OCR token:", 0) == 0 ? lines[1] : lines[0];
  } else if (lines.size() == 2) {
    *question = lines[0];
  } else {
    return false;
  }
  *question = py::lower(*question);
  return true;
}

ScoreResult score_textvqa(const ScoreInputs& in) {
  require_inputs(in, "textvqa", 1, false);
  ScoreResult r;
  const Json doc = read_json(in.annotations[0]);
  if (!doc.is_object() || !doc.contains("data") || !doc["data"].is_array())
    throw std::runtime_error(in.annotations[0] + ": no 'data' list (a TextVQA annotation file)");
  std::map<std::pair<std::string, std::string>, size_t>
      by_key;  // (image_id, lower question) -> index; last wins
  const Json& data = doc["data"];
  for (size_t i = 0; i < data.size(); ++i) {
    const std::string where = in.annotations[0] + "[data #" + std::to_string(i) + "]";
    const Json& a = data[i];
    const std::string id = a.is_object() && a.contains("image_id") ? id_key(a["image_id"]) : "";
    if (id.empty() || !a.contains("question") || !a["question"].is_string()) {
      r.problems.push_back({where, "no 'image_id' or 'question'"});
      continue;
    }
    by_key[{id, py::lower(a["question"].get<std::string>())}] = i;
  }
  std::vector<Pred> preds;
  AnswerIds seen("eval_textvqa.py", Repeats::kAllCount);
  std::set<size_t> answered;
  for (const Record& rec : read_jsonl(in.answers, &r.problems)) {
    const std::string id = id_key(rec, "question_id", &r.problems);
    const std::string* prompt = string_field(rec, "prompt", &r.problems);
    const std::string* text = string_field(rec, "text", &r.problems);
    if (id.empty() || !prompt || !text) continue;
    std::string question;
    if (!textvqa_question(*prompt, &question)) {
      r.problems.push_back({rec.where, "the prompt has no question in a shape eval_textvqa.py knows"});
      continue;
    }
    const auto it = by_key.find({id, question});
    if (it == by_key.end()) {
      r.problems.push_back({rec.where, "no annotation with image_id " + id_text(rec.value["question_id"]) +
                                           " and question \"" + question + "\""});
      continue;
    }
    seen.add(id + "\n" + question, id_text(rec.value["question_id"]) + " (\"" + question + "\")", rec.where,
             &r.problems);
    answered.insert(it->second);
    Pred p{*text, {}, id_text(rec.value["question_id"])};
    const Json& a = data[it->second];
    if (!ten_answers(a.contains("answers") ? a["answers"] : Json(),
                     in.annotations[0] + "[data #" + std::to_string(it->second) + "]", &p.gt, &r.problems))
      continue;
    preds.push_back(std::move(p));
  }
  for (const auto& [key, i] : by_key)
    if (!answered.count(i))
      r.problems.push_back({in.annotations[0] + "[data #" + std::to_string(i) + "]",
                            "no answer for this question (eval_textvqa.py scores the answered ones only)"});
  finish(r, preds);
  return r;
}

ScoreResult score_vqav2(const ScoreInputs& in) {
  if (rule_of(in, "vqav2") == "vqaeval") return score_vqav2_vqaeval(in);
  require_inputs(in, "vqav2", 1, false);
  ScoreResult r;
  const Json doc = read_json(in.annotations[0]);
  if (!doc.is_object() || !doc.contains("annotations") || !doc["annotations"].is_array())
    throw std::runtime_error(in.annotations[0] + ": no 'annotations' list (a VQA v2 annotation file)");
  const Json& anns = doc["annotations"];
  std::map<std::string, size_t> by_id;
  for (size_t i = 0; i < anns.size(); ++i) {
    const std::string id =
        anns[i].is_object() && anns[i].contains("question_id") ? id_key(anns[i]["question_id"]) : "";
    if (id.empty())
      r.problems.push_back(
          {in.annotations[0] + "[annotations #" + std::to_string(i) + "]", "no 'question_id'"});
    else
      by_id[id] = i;
  }
  std::vector<Pred> preds;
  AnswerIds seen("the m4c evaluator (TextVQAAccuracyEvaluator.eval_pred_list)", Repeats::kAllCount);
  for (const Record& rec : read_jsonl(in.answers, &r.problems)) {
    const std::string id = id_key(rec, "question_id", &r.problems);
    const std::string* text = string_field(rec, "text", &r.problems);
    if (id.empty() || !text) continue;
    const auto it = by_id.find(id);
    if (it == by_id.end()) {
      r.problems.push_back({rec.where, "no annotation for question_id " + id_text(rec.value["question_id"])});
      continue;
    }
    seen.add(id, id_text(rec.value["question_id"]), rec.where, &r.problems);
    Pred p{*text, {}, id_text(rec.value["question_id"])};
    const Json& a = anns[it->second];
    if (!ten_answers(a.contains("answers") ? a["answers"] : Json(),
                     in.annotations[0] + "[annotations #" + std::to_string(it->second) + "]", &p.gt,
                     &r.problems))
      continue;
    preds.push_back(std::move(p));
  }
  for (const auto& [id, i] : by_id)
    if (!seen.contains(id))
      r.problems.push_back({in.annotations[0] + "[annotations #" + std::to_string(i) + "]",
                            "no answer for question_id " + id_text(anns[i]["question_id"]) +
                                " (the m4c evaluator scores the answered ones only)"});
  finish(r, preds);
  return r;
}

}  // namespace gmod::eval

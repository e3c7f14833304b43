// ScienceQA multiple-choice accuracy (see score_scienceqa.h).
#include "eval/score_scienceqa.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include <map>
#include <set>

#include "eval/answer_ids.h"
#include "eval/pystr.h"
#include "eval/regex.h"

namespace gmod::eval {
namespace {

const std::string kOptions = "ABCDE";

bool is_option(const std::string& s) { return s.size() == 1 && kOptions.find(s[0]) != std::string::npos; }

}  // namespace

std::string scienceqa_letter(const std::string& text, const std::string& rule) {
  static const Regex answer_is("The answer is ([A-Z]).");
  if (is_option(text)) return text;
  // len(pred_text) >= 3 counts code points; pred_text[0] is an option only when it is an ASCII A-E
  if (py::length(text) >= 3 && is_option(text.substr(0, 1)) &&
      (rule == "gamma-mod" || text.compare(1, 2, ". ") == 0))
    return text.substr(0, 1);
  const auto found = answer_is.findall(text);
  return found.size() == 1 ? found[0] : "FAILED";
}

ScoreResult score_scienceqa(const ScoreInputs& in) {
  require_inputs(in, "scienceqa", 1, false);
  const std::string rule = rule_of(in, "scienceqa");
  const std::string split = in.split.empty() ? "test" : in.split;
  const std::string script = rule == "llava" ? "LLaVA's eval_science_qa.py" : "γ-MoD's eval_science_qa.py";
  std::string problems_path, splits_path;
  struct stat st {};
  if (in.annotations.size() == 1 && stat(in.annotations[0].c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    problems_path = in.annotations[0] + "/problems.json";
    splits_path = in.annotations[0] + "/pid_splits.json";
  } else if (in.annotations.size() == 2) {
    problems_path = in.annotations[0];
    splits_path = in.annotations[1];
  } else if (in.annotations.size() == 1 && stat(in.annotations[0].c_str(), &st) != 0) {
    throw std::invalid_argument("scienceqa: --annotations " + in.annotations[0] + ": " + std::strerror(errno) +
                                " (give the ScienceQA dir, or problems.json and pid_splits.json)");
  } else {
    throw std::invalid_argument(
        "scienceqa: --annotations is the ScienceQA dir, or problems.json and pid_splits.json" +
        std::string(in.annotations.size() == 1 ? " (" + in.annotations[0] + " is a file)" : ""));
  }
  ScoreResult r;
  const Json problems = read_json(problems_path);
  const Json splits = read_json(splits_path);
  if (!problems.is_object()) throw std::runtime_error(problems_path + ": not a JSON object of problems");
  if (!splits.is_object() || !splits.contains(split) || !splits[split].is_array())
    throw std::runtime_error(splits_path + ": no list of problem ids for split '" + split + "'");

  std::map<std::string, Record> predictions;  // question_id -> answer record (the last one wins)
  AnswerIds seen(script, Repeats::kLastWins);
  for (Record& rec : read_jsonl(in.answers, &r.problems)) {
    const std::string id = id_key(rec, "question_id", &r.problems);
    if (id.empty() || !string_field(rec, "text", &r.problems) || !string_field(rec, "prompt", &r.problems))
      continue;
    seen.add(id, id_text(rec.value["question_id"]), rec.where, &r.problems);
    predictions[id] = std::move(rec);
  }
  int64_t total = 0, correct = 0, img_total = 0, img_correct = 0;
  std::set<std::string> in_split;
  for (const Json& pid : splits[split]) {
    const std::string at = splits_path + "[" + split + "]";
    if (!pid.is_string()) {
      r.problems.push_back({at, "a problem id that is not a string: " + pid.dump()});
      continue;
    }
    const std::string id = pid.get<std::string>();
    if (!in_split.insert(id_key(pid)).second) continue;  // a dict of the split: a repeated id counts once
    const auto prob = problems.find(id);
    if (prob == problems.end() || !prob->is_object() || !prob->contains("choices") ||
        !(*prob)["choices"].is_array() || !prob->contains("answer") ||
        !(*prob)["answer"].is_number_integer()) {
      r.problems.push_back(
          {problems_path + "[" + id + "]", "missing, or without 'choices' list and integer 'answer'"});
      continue;
    }
    const auto p = predictions.find(id_key(pid));
    std::string text = "FAILED", prompt = "Unknown";
    if (p == predictions.end()) {
      r.problems.push_back(
          {problems_path + "[" + id + "]", "no answer for this problem (FAILED, counted as wrong)"});
    } else {
      text = p->second.value["text"].get<std::string>();
      prompt = p->second.value["prompt"].get<std::string>();
    }
    const std::string letter = scienceqa_letter(text, rule);
    const size_t n_choices = (*prob)["choices"].size();
    const size_t idx = letter.size() == 1 ? kOptions.find(letter[0]) : std::string::npos;
    const bool hit = idx != std::string::npos && idx < n_choices &&
                     static_cast<int64_t>(idx) == (*prob)["answer"].get<int64_t>();
    const bool image = prompt.find("<image>") != std::string::npos;
    ++total, correct += hit;
    img_total += image, img_correct += image && hit;
    const int64_t gt = (*prob)["answer"].get<int64_t>();
    r.per_question.push_back({{"id", id},
                              {"prediction", text},
                              {"parsed", letter},
                              {"answer", gt >= 0 && gt < 5 ? Json(kOptions.substr(gt, 1)) : Json(gt)},
                              {"image", image},
                              {"score", hit ? 1 : 0}});
  }
  if (total == 0)
    r.problems.push_back({splits_path, "split '" + split + "' has no problems: " + script +
                                           " stops there (ZeroDivisionError); no accuracy"});
  else if (img_total == 0)
    r.problems.push_back({in.answers, "no answered problem of split '" + split + "' has an image: " + script +
                                          " stops there (ZeroDivisionError); no IMG accuracy"});
  for (const auto& [id, rec] : predictions)
    if (!in_split.count(id))
      r.problems.push_back({rec.where, "question_id " + id_text(rec.value["question_id"]) +
                                           " is not in split '" + split + "'"});
  r.figures["count"] = total;
  r.figures["correct"] = correct;
  r.figures["acc"] = total ? Json(static_cast<double>(correct) / static_cast<double>(total) * 100) : Json();
  r.figures["img_count"] = img_total;
  r.figures["img_correct"] = img_correct;
  r.figures["img_acc"] =
      img_total ? Json(static_cast<double>(img_correct) / static_cast<double>(img_total) * 100) : Json();
  r.lines.push_back("problems      " + std::to_string(total) + " (" + split + ")");
  r.lines.push_back("accuracy      " +
                    (total ? percent(static_cast<double>(correct) / static_cast<double>(total)) : "n/a") +
                    " (" + std::to_string(correct) + " correct)");
  r.lines.push_back(
      "IMG accuracy  " +
      (img_total ? percent(static_cast<double>(img_correct) / static_cast<double>(img_total)) : "n/a") +
      " (" + std::to_string(img_correct) + " of " + std::to_string(img_total) + " with an image)");
  return r;
}

}  // namespace gmod::eval

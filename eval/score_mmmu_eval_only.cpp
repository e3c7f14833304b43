// MMMU's eval-only mode (see score_mmmu.h): {id: prediction} against the answer dict, as γ-MoD's
// eval_mmmu_only.py and MMMU's main_eval_only.py score it.
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "eval/mmmu_parse.h"
#include "eval/mmmu_subjects.h"
#include "eval/pystr.h"
#include "eval/score_mmmu.h"

namespace gmod::eval {
namespace {

const char* const kMmmuScript = "eval_mmmu_only.py";

// A JSON object file; `repeated` gets the top-level keys that occur more than once (json.load keeps the last
// value, at the first key's place, as nlohmann's parser does).
Json read_object(const std::string& path, std::vector<std::string>* repeated) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(path + ": cannot open for reading");
  std::stringstream ss;
  ss << f.rdbuf();
  std::map<std::string, int> count;
  const auto cb = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::key && depth == 1 && ++count[parsed.get<std::string>()] == 2)
      repeated->push_back(parsed.get<std::string>());
    return true;
  };
  try {
    return Json::parse(ss.str(), cb);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": not a JSON document (" + e.what() + ")");
  }
}

Json value_of(const std::vector<mmmu::Value>& values) {
  Json out = Json::array();
  for (const auto& v : values) out.push_back(v.is_number ? Json(v.number) : Json(v.text));
  return out;
}

}  // namespace

ScoreResult score_mmmu_eval_only(const ScoreInputs& in) {
  ScoreResult r;
  if (in.annotations.size() != 1)
    throw std::invalid_argument(
        "mmmu: an {id: prediction} answer file (eval-only mode) is scored against one --annotations "
        "answer dict (answer_dict_val.json), got " +
        std::to_string(in.annotations.size()));
  const std::string& dict_path = in.annotations[0];
  std::vector<std::string> repeated, repeated_dict;
  const Json outputs = read_object(in.answers, &repeated);
  const Json answers = read_object(dict_path, &repeated_dict);
  if (!answers.is_object())
    throw std::runtime_error(dict_path + ": not a JSON object {id: {question_type, ground_truth}}");
  for (const std::string& k : repeated)
    r.problems.push_back({in.answers + "[" + k + "]", "id given more than once: " + std::string(kMmmuScript) +
                                                          " (json.load) keeps the last value, as gmod does"});
  for (const std::string& k : repeated_dict)
    r.problems.push_back({dict_path + "[" + k + "]", "id given more than once: the last entry counts"});
  const std::set<std::string> known(mmmu::subjects().begin(), mmmu::subjects().end());
  std::map<std::string, std::vector<std::pair<std::string, const Json*>>> by_cat;  // outputs per subject
  std::set<std::string> answer_cats;
  for (const auto& [id, v] : answers.items()) answer_cats.insert(mmmu::subject_of(id));
  for (const auto& [id, pred] : outputs.items()) {
    const std::string cat = mmmu::subject_of(id), where = in.answers + "[" + id + "]";
    if (!known.count(cat))
      r.problems.push_back({where, "'" + cat + "' is not an MMMU subject: " + kMmmuScript + " skips it"});
    else if (!answer_cats.count(cat))
      r.problems.push_back({where, "no id of subject " + cat + " in " + dict_path + ": " + kMmmuScript +
                                       " skips the subject"});
    else
      by_cat[cat].emplace_back(id, &pred);
  }
  struct Cat {
    int64_t num = 0, correct = 0;
    double acc = 0;
  };
  std::map<std::string, Cat> results;
  std::vector<std::string> evaluated;  // in the order evaluated (the subject table's)
  int64_t correct_all = 0;
  for (const std::string& cat : mmmu::subjects()) {
    if (!by_cat.count(cat)) continue;
    Cat c;
    for (const auto& [id, pred] : by_cat[cat]) {
      const std::string where = in.answers + "[" + id + "]";
      const auto a = answers.find(id);
      if (a == answers.end() || !a->is_object() || !a->contains("question_type") ||
          !(*a)["question_type"].is_string() || !a->contains("ground_truth")) {
        r.problems.push_back({where, "no entry {question_type, ground_truth} for this id in " + dict_path +
                                         ": " + kMmmuScript + " stops here (KeyError)"});
        continue;
      }
      const Json& gold = (*a)["ground_truth"];
      const bool mc = (*a)["question_type"].get<std::string>() == "multiple-choice";
      bool hit = false;
      Json parsed;
      if (mc) {
        parsed = *pred;  // the letter model_mmmu.py parsed, compared as it is
        if (gold.is_array()) {
          for (const Json& g : gold) hit = hit || g == *pred;
        } else {
          hit = gold == *pred;
        }
      } else {
        std::vector<std::string> golds;
        const bool ok = open_gold_strings(gold, golds);
        if (!pred->is_string() || !ok) {
          r.problems.push_back({where, std::string(!pred->is_string() ? "an open answer that is not a string"
                                                                      : "a ground_truth that is not a string "
                                                                        "or a list of strings") +
                                           ": " + kMmmuScript +
                                           " stops here (parse_open_response/normalize_str)"});
          continue;
        }
        const std::vector<mmmu::Value> values = mmmu::parse_open(pred->get<std::string>());
        hit = mmmu::eval_open(golds, values);
        parsed = value_of(values);
      }
      ++c.num, c.correct += hit;
      r.per_question.push_back(
          {{"id", id}, {"prediction", *pred}, {"parsed", parsed}, {"answer", gold}, {"score", hit ? 1 : 0}});
    }
    if (c.num == 0) {
      r.problems.push_back({in.answers, "subject " + cat + " has no scorable answer: " + kMmmuScript +
                                            " stops here (evaluate returns no judgement)"});
      continue;
    }
    c.acc = static_cast<double>(c.correct) / static_cast<double>(c.num);
    correct_all += c.correct;
    results[cat] = c;
    evaluated.push_back(cat);
  }
  for (const auto& [id, v] : answers.items())
    if (!outputs.contains(id) && known.count(mmmu::subject_of(id)))
      r.problems.push_back(
          {dict_path + "[" + id + "]",
           "no prediction for this id: " + std::string(kMmmuScript) + " leaves it out of the accuracy"});
  // calculate_ins_level_acc: sum of acc * num in the given order, over the sum of num
  const auto ins_acc = [&](const std::vector<std::string>& cats, int64_t* num) {
    double acc = 0;
    *num = 0;
    for (const std::string& c : cats)
      if (results.count(c))
        acc += results[c].acc * static_cast<double>(results[c].num), *num += results[c].num;
    return *num ? acc / static_cast<double>(*num) : 0.0;
  };
  Json printable = Json::object(), categories = Json::object();
  for (const auto& [domain, cats] : mmmu::disciplines()) {
    int64_t num = 0;
    const double acc = ins_acc(cats, &num);
    printable["Overall-" + domain] = {{"num", num}, {"acc", py::round_to(acc, 3)}};
    for (const std::string& c : cats)
      if (results.count(c))
        printable[c] = {{"num", results[c].num}, {"acc", py::round_to(results[c].acc, 3)}};
  }
  int64_t total = 0;
  const double acc = ins_acc(evaluated, &total);
  printable["Overall"] = {{"num", total}, {"acc", py::round_to(acc, 3)}};
  for (const std::string& c : evaluated) categories[c] = {{"num", results[c].num}, {"acc", results[c].acc}};
  r.figures["mode"] = "eval-only";
  r.figures["questions"] = total;
  r.figures["correct"] = correct_all;
  r.figures["accuracy"] = acc;
  r.figures["categories"] = categories;
  r.figures["printable_results"] = printable;
  r.lines.push_back("questions  " + std::to_string(total) + " (eval-only: {id: prediction} against " +
                    dict_path + ")");
  r.lines.push_back("accuracy   " + percent(acc) + " (" + std::to_string(correct_all) + " correct)");
  for (const auto& [domain, cats] : mmmu::disciplines()) {
    const Json& d = printable["Overall-" + domain];
    char buf[160];
    std::snprintf(buf, sizeof buf, "  %-32s %.3f of %lld", domain.c_str(), d["acc"].get<double>(),
                  static_cast<long long>(d["num"].get<int64_t>()));
    r.lines.push_back(buf);
  }
  return r;
}

}  // namespace gmod::eval

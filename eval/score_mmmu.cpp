// MMMU multiple-choice and open accuracy (see score_mmmu.h).
#include "eval/score_mmmu.h"

#include <cctype>
#include <fstream>
#include <map>

#include "eval/answer_ids.h"
#include "eval/mmmu_parse.h"
#include "eval/mmmu_subjects.h"
#include "eval/pystr.h"

namespace gmod::eval {

bool mmmu_eval_only_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char c = 0;
  while (f.get(c) && std::isspace(static_cast<unsigned char>(c))) {
  }
  if (c != '{') return false;
  f.seekg(0);
  const Json doc = Json::parse(f, nullptr, /*allow_exceptions=*/false);
  // one JSON object for the whole file that is not itself an output.json record
  return doc.is_object() && !(doc.contains("id") && doc.contains("response"));
}

bool open_gold_strings(const Json& gold, std::vector<std::string>& out) {
  bool ok = gold.is_string() || gold.is_array();
  if (gold.is_string()) out.push_back(gold.get<std::string>());
  for (const Json& g : gold.is_array() ? gold : Json::array())
    ok = ok && g.is_string(), out.push_back(g.is_string() ? g.get<std::string>() : "");
  return ok;
}

ScoreResult score_mmmu(const ScoreInputs& in) {
  require_inputs(in, "mmmu", 0, false);
  if (mmmu_eval_only_file(in.answers)) return score_mmmu_eval_only(in);
  ScoreResult r;
  if (!in.annotations.empty())
    option_does_not_apply("--annotations",
                          "output.json records carry their answers (parse-and-eval mode); an answer dict is "
                          "read with an {id: prediction} file (eval-only mode)",
                          &r.problems);
  PyRandom rng(42);  // eval_utils.py seeds Python's random with 42 when imported
  std::vector<std::string> cat_order;
  std::map<std::string, std::pair<int64_t, int64_t>> cats;  // category -> (correct, questions)
  int64_t correct = 0, total = 0, random_picks = 0;
  Json parsed = Json::array();
  AnswerIds seen("main_parse_and_eval.py", Repeats::kAllCount);
  for (const Record& rec : read_records(in.answers, &r.problems)) {
    const std::string* id = string_field(rec, "id", &r.problems);
    const std::string* type = string_field(rec, "question_type", &r.problems);
    const std::string* response = string_field(rec, "response", &r.problems);
    if (!id || !type || !response) continue;
    const Json& answer = rec.value.contains("answer") ? rec.value["answer"] : Json();
    bool hit = false;
    Json pred;
    if (*type == "multiple-choice") {
      std::vector<std::string> choices;
      std::vector<std::pair<std::string, std::string>> index2ans;
      const Json& ac = rec.value.contains("all_choices") ? rec.value["all_choices"] : Json();
      const Json& ia = rec.value.contains("index2ans") ? rec.value["index2ans"] : Json();
      bool ok = ac.is_array() && !ac.empty() && ia.is_object();
      for (const Json& c : ac)
        ok = ok && c.is_string(), choices.push_back(c.is_string() ? c.get<std::string>() : "");
      if (ok)
        for (const auto& [k, v] : ia.items())
          ok = ok && v.is_string(), index2ans.emplace_back(k, v.is_string() ? v.get<std::string>() : "");
      if (!ok) {
        r.problems.push_back({rec.where,
                              "multiple-choice without a non-empty 'all_choices' list of strings and an "
                              "'index2ans' object of strings"});
        continue;
      }
      bool random_used = false;
      const std::string letter = mmmu::parse_multi_choice(*response, choices, index2ans, rng, &random_used);
      random_picks += random_used;
      pred = letter;
      if (answer.is_array()) {
        for (const Json& a : answer) hit = hit || (a.is_string() && a.get<std::string>() == letter);
      } else {
        hit = answer.is_string() && answer.get<std::string>() == letter;
      }
    } else {
      std::vector<std::string> gold;
      if (!open_gold_strings(answer, gold)) {
        r.problems.push_back(
            {rec.where, "open question whose 'answer' is not a string or a list of strings"});
        continue;
      }
      const std::vector<mmmu::Value> values = mmmu::parse_open(*response);
      hit = mmmu::eval_open(gold, values);
      pred = Json::array();
      for (const auto& v : values) pred.push_back(v.is_number ? Json(v.number) : Json(v.text));
    }
    seen.add(*id, *id, rec.where, &r.problems);
    const std::string cat = mmmu::subject_of(*id);
    if (!cats.count(cat)) cat_order.push_back(cat);
    cats[cat].first += hit, ++cats[cat].second;
    correct += hit, ++total;
    parsed.push_back({{"id", *id}, {"parsed_pred", pred}, {"correct", hit}});
    r.per_question.push_back({{"id", *id},
                              {"prediction", *response},
                              {"parsed", pred},
                              {"answer", answer},
                              {"score", hit ? 1 : 0}});
  }
  Json per_cat = Json::object();
  for (const std::string& c : cat_order)
    per_cat[c] = {{"num", cats[c].second},
                  {"acc", static_cast<double>(cats[c].first) / static_cast<double>(cats[c].second)}};
  const double acc = total ? static_cast<double>(correct) / static_cast<double>(total) : 0.0;
  r.figures["mode"] = "parse-and-eval";
  r.figures["questions"] = total;
  r.figures["correct"] = correct;
  r.figures["accuracy"] = acc;
  r.figures["random_choices"] = random_picks;
  r.figures["categories"] = per_cat;
  r.figures["parsed"] = parsed;
  r.lines.push_back("questions  " + std::to_string(total) + " (" + std::to_string(random_picks) +
                    " multiple-choice answers unparsable: a random option, as MMMU's scorer)");
  r.lines.push_back("accuracy   " + percent(acc) + " (" + std::to_string(correct) + " correct)");
  for (const std::string& c : cat_order)
    r.lines.push_back("  " + c + "  " +
                      percent(static_cast<double>(cats[c].first) / static_cast<double>(cats[c].second)) +
                      " of " + std::to_string(cats[c].second));
  return r;
}

}  // namespace gmod::eval

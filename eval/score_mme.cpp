// MME perception and cognition (see score_mme.h).
#include "eval/score_mme.h"

#include <filesystem>
#include <map>
#include <set>

#include "eval/mme_release.h"
#include "eval/pystr.h"

namespace gmod::eval {
namespace {

const std::set<std::string>& perception() {
  static const std::set<std::string> s = {"existence", "count", "position", "color",   "posters",
                                          "celebrity", "scene", "landmark", "artwork", "OCR"};
  return s;
}

}  // namespace

std::string mme_label(const std::string& text) {
  const std::string a = py::replace(py::strip(py::lower(text)), ".", "");
  if (a == "yes" || a == "no") return a;
  if (py::length(a) == 1) return a == "y" ? "yes" : a == "n" ? "no" : "other";
  // the first four characters (code points)
  size_t bytes = 0;
  for (int k = 0; k < 4 && bytes < a.size(); ++k) {
    ++bytes;
    while (bytes < a.size() && (static_cast<unsigned char>(a[bytes]) & 0xC0) == 0x80) ++bytes;
  }
  const std::string prefix = a.substr(0, bytes);
  if (prefix.find("yes") != std::string::npos) return "yes";
  if (prefix.find("no") != std::string::npos) return "no";
  return "other";
}

ScoreResult score_mme(const ScoreInputs& in) {
  require_inputs(in, "mme", 1, false);
  ScoreResult r;
  struct Truth {
    std::string category, answer, where;
  };
  std::map<std::pair<std::string, std::string>, Truth> truth;  // (question id, question) -> truth
  bool release = false;                                        // some truth comes from MME's release folder
  for (const std::string& file : in.annotations) {
    std::error_code ec;
    if (std::filesystem::is_directory(file, ec)) {
      release = true;
      for (const MmeQuestion& m : read_mme_release(file, &r.problems)) {
        const std::string gt = py::replace(py::strip(py::lower(m.answer)), ".", "");
        if (gt != "yes" && gt != "no") {
          r.problems.push_back({m.where, "answer \"" + m.answer + "\" is not yes or no"});
          continue;
        }
        truth[{"release:" + m.category + "/" + m.file, m.question}] = {m.category, gt, m.where};
      }
      continue;
    }
    for (const Record& rec : read_jsonl(file, &r.problems)) {
      const std::string id = id_key(rec, "question_id", &r.problems);
      const std::string* cat = string_field(rec, "category", &r.problems);
      const std::string* q = string_field(rec, "question", &r.problems);
      const std::string* a = string_field(rec, "answer", &r.problems);
      if (id.empty() || !cat || !q || !a) continue;
      const std::string gt = py::replace(py::strip(py::lower(*a)), ".", "");
      if (gt != "yes" && gt != "no") {
        r.problems.push_back({rec.where, "answer \"" + *a + "\" is not yes or no"});
        continue;
      }
      truth[{id, *q}] = {*cat, gt, rec.where};
    }
  }
  // category (first-seen order) -> question id (first-seen order) -> scores
  std::vector<std::string> cat_order;
  std::map<std::string, std::vector<std::string>> id_order;
  std::map<std::string, std::map<std::string, std::vector<double>>> scores;
  std::map<std::string, std::string> id_shown;
  int64_t other = 0;
  std::set<std::pair<std::string, std::string>> matched;
  for (const Record& rec : read_jsonl(in.answers, &r.problems)) {
    const std::string id = id_key(rec, "question_id", &r.problems);
    const std::string* prompt = string_field(rec, "prompt", &r.problems);
    const std::string* text = string_field(rec, "text", &r.problems);
    if (id.empty() || !prompt || !text) continue;
    auto t = truth.find({id, *prompt});
    if (t == truth.end() && release && rec.value["question_id"].is_string()) {
      // as LLaVA's convert_answer_to_mme.py files it: category and question file from the id, the released
      // question from the prompt
      const auto [cat, qfile] = mme_answer_file(rec.value["question_id"].get<std::string>());
      for (const std::string& q : mme_released_questions(*prompt))
        if ((t = truth.find({"release:" + cat + "/" + qfile, q})) != truth.end()) break;
    }
    if (t == truth.end()) {
      r.problems.push_back({rec.where, "no annotation with question_id " + id_text(rec.value["question_id"]) +
                                           " and this prompt as its question"});
      continue;
    }
    matched.insert(t->first);
    const std::string label = mme_label(*text);
    other += label == "other";
    r.per_question.push_back({{"id", id_text(rec.value["question_id"])},
                              {"prediction", *text},
                              {"parsed", label},
                              {"answer", t->second.answer},
                              {"score", label == t->second.answer ? 1 : 0}});
    const std::string& cat = t->second.category;
    if (!scores.count(cat)) cat_order.push_back(cat);
    auto& by_id = scores[cat];
    if (!by_id.count(id)) id_order[cat].push_back(id);
    by_id[id].push_back(label == t->second.answer ? 1.0 : 0.0);
    id_shown[id] = id_text(rec.value["question_id"]);
  }
  for (const auto& [key, t] : truth)
    if (!matched.count(key))
      r.problems.push_back({t.where, "no answer for this question (its image is left out of " + t.category +
                                         ", as MME's calculation.py scores the answered pairs)"});
  double perception_total = 0, cognition_total = 0;
  Json cats = Json::object();
  for (const std::string& cat : cat_order) {
    double total = 0, right = 0;
    int64_t images = 0, both = 0, questions = 0;
    for (const std::string& id : id_order[cat]) {
      const std::vector<double>& s = scores[cat][id];
      if (s.size() != 2) {
        r.problems.push_back({in.answers, "category " + cat + ", question_id " + id_shown[id] + ": " +
                                              std::to_string(s.size()) +
                                              " answers, MME scores pairs (left out)"});
        continue;
      }
      const double sum = s[0] + s[1];
      const double acc = sum / 2 * 100.0;
      const double acc_plus = (sum == 2) * 100.0;
      total += acc_plus + acc;
      ++images, both += sum == 2, questions += 2, right += sum;
    }
    if (!images) continue;
    const double score = total / static_cast<double>(images);
    (perception().count(cat) ? perception_total : cognition_total) += score;
    cats[cat] = {{"score", score},
                 {"acc", right / static_cast<double>(questions) * 100.0},
                 {"acc_plus", static_cast<double>(both) / static_cast<double>(images) * 100.0},
                 {"images", images}};
    char buf[160];
    std::snprintf(buf, sizeof buf, "  %-24s %8.2f  (acc %.2f, acc+ %.2f, %lld images)", cat.c_str(), score,
                  right / static_cast<double>(questions) * 100.0,
                  static_cast<double>(both) / static_cast<double>(images) * 100.0,
                  static_cast<long long>(images));
    r.lines.push_back(buf);
  }
  r.figures["perception"] = perception_total;
  r.figures["cognition"] = cognition_total;
  r.figures["categories"] = cats;
  r.figures["unparsed_answers"] = other;
  char buf[160];
  std::snprintf(buf, sizeof buf, "perception %.2f, cognition %.2f (%lld answers neither yes nor no)",
                perception_total, cognition_total, static_cast<long long>(other));
  r.lines.push_back(buf);
  return r;
}

}  // namespace gmod::eval

// POPE per-split scores (see score_pope.h).
#include "eval/score_pope.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>

#include "eval/answer_ids.h"
#include "eval/pystr.h"

namespace gmod::eval {
namespace {

// The label files named by --annotations (a folder: its files, sorted by name).
std::vector<std::string> label_files(const std::vector<std::string>& annotations) {
  std::vector<std::string> files;
  for (const std::string& a : annotations) {
    struct stat st {};
    if (stat(a.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      DIR* d = opendir(a.c_str());
      if (!d) throw std::runtime_error(a + ": cannot list the folder");
      std::vector<std::string> names;
      while (dirent* e = readdir(d))
        if (e->d_name[0] != '.') names.push_back(e->d_name);
      closedir(d);
      std::sort(names.begin(), names.end());
      for (const auto& n : names) files.push_back(a + "/" + n);
    } else {
      files.push_back(a);
    }
  }
  return files;
}

Json ratio(int64_t num, int64_t den) {
  return den ? Json(static_cast<double>(num) / static_cast<double>(den)) : Json();
}

}  // namespace

bool pope_says_yes(const std::string& text) {
  std::string t = text.find('.') != std::string::npos ? py::split(text, ".")[0] : text;
  t = py::replace(t, ",", "");
  for (const std::string& w : py::split(t, " "))
    if (w == "No" || w == "not" || w == "no") return false;
  return true;
}

ScoreResult score_pope(const ScoreInputs& in) {
  require_inputs(in, "pope", 1, true);
  ScoreResult r;
  std::map<std::string, std::string> category;  // question id -> category
  for (const Record& q : read_jsonl(in.questions, &r.problems)) {
    const std::string id = id_key(q, "question_id", &r.problems);
    const std::string* c = string_field(q, "category", &r.problems);
    if (!id.empty() && c) category[id] = *c;
  }
  // answers per category, in file order: (says yes, where)
  std::map<std::string, std::vector<std::pair<bool, std::string>>> answers;
  AnswerIds seen("eval_pope.py", Repeats::kAllCount);
  for (const Record& rec : read_jsonl(in.answers, &r.problems)) {
    const std::string id = id_key(rec, "question_id", &r.problems);
    const std::string* text = string_field(rec, "text", &r.problems);
    if (id.empty() || !text) continue;
    const auto c = category.find(id);
    if (c == category.end()) {
      r.problems.push_back(
          {rec.where, "question_id " + id_text(rec.value["question_id"]) + " is not in " + in.questions});
      continue;
    }
    seen.add(id, id_text(rec.value["question_id"]), rec.where, &r.problems);
    answers[c->second].emplace_back(pope_says_yes(*text), rec.where);
    r.per_question.push_back({{"id", id_text(rec.value["question_id"])},
                              {"prediction", *text},
                              {"parsed", answers[c->second].back().first ? "yes" : "no"},
                              {"category", c->second}});
  }
  std::set<std::string> scored;
  double f1_sum = 0, acc_sum = 0;
  int f1_n = 0, acc_n = 0;
  Json splits = Json::object();
  for (const std::string& file : label_files(in.annotations)) {
    const std::string base = file.substr(file.find_last_of('/') + 1);
    if (base.rfind("coco_pope_", 0) != 0 || base.size() < 15 ||
        base.compare(base.size() - 5, 5, ".json") != 0)
      throw std::runtime_error(file + ": a POPE label file is named coco_pope_<category>.json");
    const std::string cat = base.substr(10, base.size() - 15);
    scored.insert(cat);
    // labels in file order; a bad line keeps its place (its pair is left out and named)
    std::vector<std::pair<int, std::string>> labels;  // 1 positive, 0 negative, -1 unreadable
    {
      std::ifstream f(file);
      if (!f) throw std::runtime_error(file + ": cannot open for reading");
      std::string line;
      for (int64_t n = 1; std::getline(f, line); ++n) {
        const std::string where = file + ":" + std::to_string(n);
        const Json v = Json::parse(line, nullptr, false);
        if (v.is_discarded() || !v.is_object() || !v.contains("label") || !v["label"].is_string()) {
          r.problems.push_back({where, "not a JSON object with a string 'label' (its pair is left out)"});
          labels.emplace_back(-1, where);
        } else {
          labels.emplace_back(v["label"].get<std::string>() == "no" ? 0 : 1, where);
        }
      }
    }
    const auto& ans = answers[cat];
    int64_t tp = 0, fp = 0, tn = 0, fn = 0, yes = 0;
    for (const auto& a : ans) yes += a.first;
    const size_t n = std::min(ans.size(), labels.size());
    for (size_t i = 0; i < n; ++i) {
      if (labels[i].first < 0) {
        r.problems.push_back(
            {ans[i].second, "paired with the unreadable label " + labels[i].second + " (left out)"});
        continue;
      }
      const bool pos = labels[i].first == 1;
      tp += ans[i].first && pos, fp += ans[i].first && !pos, tn += !ans[i].first && !pos,
          fn += !ans[i].first && pos;
    }
    for (size_t i = n; i < ans.size(); ++i)
      r.problems.push_back({ans[i].second, "answer " + std::to_string(i + 1) + " of category " + cat +
                                               " has no label (" + file + " has " +
                                               std::to_string(labels.size()) + " lines)"});
    for (size_t i = n; i < labels.size(); ++i)
      r.problems.push_back({labels[i].second, "no answer of category " + cat + " for this label (" +
                                                  std::to_string(ans.size()) + " answers)"});
    const Json precision = ratio(tp, tp + fp), recall = ratio(tp, tp + fn);
    Json f1;
    if (!precision.is_null() && !recall.is_null() && precision.get<double>() + recall.get<double>() > 0) {
      const double p = precision.get<double>(), rc = recall.get<double>();
      f1 = 2 * p * rc / (p + rc);
    }
    const Json acc = ratio(tp + tn, tp + tn + fp + fn);
    splits[cat] = {{"samples", ans.size()},
                   {"TP", tp},
                   {"FP", fp},
                   {"TN", tn},
                   {"FN", fn},
                   {"accuracy", acc},
                   {"precision", precision},
                   {"recall", recall},
                   {"f1", f1},
                   {"yes_ratio", ratio(yes, static_cast<int64_t>(ans.size()))}};
    if (!f1.is_null()) f1_sum += f1.get<double>(), ++f1_n;
    if (!acc.is_null()) acc_sum += acc.get<double>(), ++acc_n;
    if (f1.is_null())
      r.problems.push_back({file, "split " + cat + " has no F1 (" +
                                      std::string(ans.empty()    ? "no answers"
                                                  : tp + fp == 0 ? "no 'yes' answer: precision 0/0"
                                                  : tp + fn == 0 ? "no positive label: recall 0/0"
                                                                 : "precision and recall 0") +
                                      "): eval_pope.py stops there (ZeroDivisionError)"});
    auto show = [](const Json& x) { return x.is_null() ? std::string("n/a") : percent(x.get<double>()); };
    r.lines.push_back(cat + ": " + std::to_string(ans.size()) + " answers  TP " + std::to_string(tp) +
                      "  FP " + std::to_string(fp) + "  TN " + std::to_string(tn) + "  FN " +
                      std::to_string(fn) + "  acc " + show(acc) + "  precision " + show(precision) +
                      "  recall " + show(recall) + "  F1 " + show(f1) + "  yes " +
                      show(splits[cat]["yes_ratio"]));
  }
  for (const auto& [cat, ans] : answers)
    if (!scored.count(cat))
      for (const auto& a : ans) r.problems.push_back({a.second, "category " + cat + " has no label file"});
  r.figures["splits"] = splits;
  r.figures["mean_f1"] = f1_n ? Json(f1_sum / f1_n) : Json();
  r.figures["mean_accuracy"] = acc_n ? Json(acc_sum / acc_n) : Json();
  // eval_pope.py prints each split only; the means are gmod's, each over the splits that have the figure
  r.figures["f1_splits"] = f1_n;
  r.figures["accuracy_splits"] = acc_n;
  if (f1_n || acc_n)
    r.lines.push_back("mean F1 " + (f1_n ? percent(f1_sum / f1_n) : std::string("n/a")) + " over " +
                      std::to_string(f1_n) + " split(s), mean accuracy " +
                      (acc_n ? percent(acc_sum / acc_n) : std::string("n/a")) + " over " +
                      std::to_string(acc_n) + " split(s)");
  return r;
}

}  // namespace gmod::eval

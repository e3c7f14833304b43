// MMBench circular evaluation (see score_mmbench.h).
#include "eval/score_mmbench.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>

#include "eval/answer_ids.h"
#include "eval/pystr.h"

namespace gmod::eval {
namespace {

int count_in(const std::vector<std::string>& splits, const std::string& letters, const std::string& pre,
             const std::string& suf) {
  int n = 0;
  for (char c : letters) n += std::find(splits.begin(), splits.end(), pre + c + suf) != splits.end();
  return n;
}

std::string can_infer_option(const std::string& answer) {
  const std::string letters = "ABCDE";
  if (answer.find("Failed to obtain answer via API") != std::string::npos) return "";
  const std::vector<std::string> splits = py::split_ws(answer);
  auto has = [&](const std::string& w) { return std::find(splits.begin(), splits.end(), w) != splits.end(); };
  if (count_in(splits, letters, "", "") == 1) {
    for (char c : letters) {
      if (has("A") && splits.size() > 3) break;  // "A" may be an article
      if (has(std::string(1, c))) return std::string(1, c);
    }
  }
  static const std::pair<const char*, const char*> kShapes[] = {
      {"", "."},   {"", ","}, {"", ":"},  {"", ")"},  {"", ")."}, {"(", ")"},
      {"(", ")."}, {":", ""}, {":", ","}, {":", "."}, {":", ")"}, {":", ")."}};
  for (const auto& [pre, suf] : kShapes)
    if (count_in(splits, letters, pre, suf) == 1)
      for (char c : letters)
        if (has(pre + std::string(1, c) + suf)) return std::string(1, c);
  return "";
}

std::string can_infer_text(const std::string& answer, const std::map<char, std::string>& choices) {
  const std::string a = py::lower(answer);
  std::string found;
  int n = 0;
  for (const auto& [k, v] : choices)
    if (a.find(py::lower(v)) != std::string::npos) found = std::string(1, k), ++n;
  return n == 1 ? found : "";
}

// str.isalpha() of the code point starting at byte i.
bool is_alpha_at(const std::string& s, size_t i) {
  size_t len = 0;
  return py::is_alpha_at(s, i, &len);
}

size_t prev_cp(const std::string& s, size_t i) {  // start of the code point before byte i
  do --i;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80);
  return i;
}

}  // namespace

std::string mmbench_can_infer(const std::string& answer, const std::map<char, std::string>& choices) {
  const std::string o = can_infer_option(answer);
  return o.empty() ? can_infer_text(answer, choices) : o;
}

std::string mmbench_extract_mcq(const std::string& response, const std::vector<std::string>& choices_in) {
  if (py::strip(response).empty()) return "";
  const std::vector<std::string> choices =
      choices_in.empty() ? std::vector<std::string>{"A", "B", "C", "D", "E", "F", "G", "H"} : choices_in;
  std::string text = py::strip(response);
  for (const char* c : {",", ".", "!", "?", ";", ":", "'", "\""}) text = py::strip_chars(text, c);
  text = " " + text + " ";
  struct Cand {
    std::string letter;
    size_t pos;
    int priority;
  };
  std::vector<Cand> cands;
  const std::pair<std::string, int> shapes[] = {{"(", 6}, {".", 5}, {":", 4}, {")", 3}, {" ", 2}};
  for (const auto& [shape, prio] : shapes)
    for (const std::string& ch : choices) {
      const std::string pat = shape == "(" ? "(" + ch + ")" : ch + shape;
      if (text.find(pat) != std::string::npos) cands.push_back({ch, text.rfind(pat), prio});
    }
  static const char* const kPhrases[] = {"the answer is",
                                         "answer is",
                                         "the correct answer is",
                                         "correct answer is",
                                         "the best answer is",
                                         "best answer is",
                                         "the correct option is",
                                         "correct option is",
                                         "the best option is",
                                         "best option is",
                                         "the choice is",
                                         "choice is",
                                         "the correct choice is",
                                         "correct choice is",
                                         "i choose",
                                         "i select",
                                         "i pick",
                                         "my answer is",
                                         "my choice is",
                                         "옵션",
                                         "정답은",
                                         "답은",
                                         "답:",
                                         "答案是",
                                         "答案为",
                                         "选",
                                         "答えは"};
  const std::string text_lower = py::lower(text);
  for (const char* phrase : kPhrases) {
    const size_t at = text_lower.find(phrase);
    if (at == std::string::npos) continue;
    const size_t after = at + std::string(phrase).size();
    for (const std::string& ch : choices) {
      const size_t p = text.find(ch, after);
      if (p != std::string::npos) cands.push_back({ch, p, 7});
    }
  }
  const std::string stripped = py::strip(text);
  for (const std::string& ch : choices)
    if (stripped.rfind(ch, 0) == 0 && (py::length(stripped) == 1 || !is_alpha_at(stripped, ch.size())))
      cands.push_back({ch, 0, 10});
  for (const std::string& ch : choices)
    if (stripped.size() >= ch.size() && stripped.compare(stripped.size() - ch.size(), ch.size(), ch) == 0 &&
        (py::length(stripped) == 1 || !is_alpha_at(stripped, prev_cp(stripped, stripped.size() - ch.size()))))
      cands.push_back({ch, text.size() - 1, 9});
  if (cands.empty())
    for (const std::string& ch : choices)
      if (text.find(ch) != std::string::npos) cands.push_back({ch, text.rfind(ch), 0});
  if (cands.empty()) return "";
  std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) {
    return a.priority != b.priority ? a.priority > b.priority : a.pos > b.pos;
  });
  return cands[0].letter;
}

ScoreResult score_mmbench(const ScoreInputs& in) {
  require_inputs(in, "mmbench", 1, false);
  ScoreResult r;
  struct Row {
    int64_t index;
    std::map<char, std::string> choices;
    std::string answer, category, l2, where, prediction;
    bool answered = false;
  };
  std::map<int64_t, Row> rows;  // by index (sorted, as the evaluator sorts)
  // Where pandas' read_csv would read an option cell differently from its text (docs/eval.md): a default NA
  // string is a missing option there; a column of numbers holds numbers ("1" -> 1.0 when some are missing).
  static const std::set<std::string> pandas_na = {
      "",     "#N/A", "#N/A N/A", "#NA",  "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
      "<NA>", "N/A",  "NA",       "NULL", "NaN",     "None",     "n/a",  "nan",  "null"};
  std::map<char, std::pair<int64_t, int64_t>> numeric;  // column -> (number cells, non-empty cells)
  int64_t na_cells = 0;
  std::string na_first;
  for (const TsvRow& t : read_tsv(in.annotations[0], &r.problems)) {
    for (char c : std::string("ABCD"))
      if (const std::string* o = t.get(std::string(1, c)); o && !o->empty()) {
        double v = 0;
        numeric[c].first += py::parse_float(*o, &v), ++numeric[c].second;
        if (pandas_na.count(*o) && !na_cells++) na_first = t.where + " column " + c + " \"" + *o + "\"";
      }
    const std::string* idx = t.get("index");
    const std::string* ans = t.get("answer");
    const std::string* cat = t.get("category");
    char* end = nullptr;
    const long long index = idx ? std::strtoll(idx->c_str(), &end, 10) : 0;
    if (!idx || idx->empty() || *end || !ans || !cat) {
      r.problems.push_back({t.where, "no integer 'index', or no 'answer' or 'category' column"});
      continue;
    }
    Row row{index, {}, *ans, *cat, "", t.where, "", false};
    if (const std::string* l2 = t.get("l2-category") ? t.get("l2-category") : t.get("L2-category"))
      row.l2 = *l2;
    for (char c : std::string("ABCD"))
      if (const std::string* o = t.get(std::string(1, c)); o && !o->empty()) row.choices[c] = *o;
    rows[index] = std::move(row);
  }
  if (na_cells)
    r.problems.push_back(
        {in.annotations[0], std::to_string(na_cells) +
                                " option cell(s) pandas reads as missing (first: " + na_first +
                                "): gmod reads the text as the option; the original's figure may "
                                "differ"});
  for (const auto& [c, n] : numeric)
    if (n.second > 0 && n.first == n.second)
      r.problems.push_back(
          {in.annotations[0], "column " + std::string(1, c) + ": all " + std::to_string(n.second) +
                                  " options are numbers, which pandas reads as numbers (\"1\" -> "
                                  "1.0 when a cell is empty): gmod compares the text; the "
                                  "original's figure may differ"});
  AnswerIds seen("MMBench's evaluator (answers merged by index)", Repeats::kLastWins);
  for (const Record& rec : read_jsonl(in.answers, &r.problems)) {
    const auto it = rec.value.find("question_id");
    const std::string* text = string_field(rec, "text", &r.problems);
    if (it == rec.value.end() || !it->is_number_integer()) {
      r.problems.push_back({rec.where, "no integer 'question_id' (the MMBench TSV index)"});
      continue;
    }
    if (!text) continue;
    const auto row = rows.find(it->get<int64_t>());
    if (row == rows.end()) {
      r.problems.push_back(
          {rec.where, "question_id " + it->dump() + " is not an index of " + in.annotations[0]});
      continue;
    }
    seen.add(it->dump(), it->dump(), rec.where, &r.problems);
    row->second.prediction = py::strip(*text), row->second.answered = true;  // the last answer wins
  }
  std::map<std::string, std::pair<int64_t, int64_t>> by_cat, by_l2;  // -> (hits, questions)
  int64_t hits = 0, questions = 0;
  for (const auto& [idx, main] : rows) {
    if (idx >= 1000000) {
      if (!rows.count(idx % 1000000))
        r.problems.push_back({main.where, "circular copy of index " + std::to_string(idx % 1000000) +
                                              ", which is not in the table"});
      continue;
    }
    std::vector<const Row*> group;
    for (int64_t k = idx; k <= rows.rbegin()->first; k += 1000000)
      if (const auto it = rows.find(k); it != rows.end()) group.push_back(&it->second);
    int hit = 1;
    for (const Row* g : group)
      if (!g->answered)
        r.problems.push_back(
            {g->where, "no answer for index " + std::to_string(g->index) + " (counted as wrong)"});
    std::vector<std::string> pred;
    for (const Row* g : group) {
      pred.push_back(mmbench_can_infer(g->prediction, g->choices));
      if (!pred.back().empty() && pred.back() != g->answer) hit = 0;
    }
    for (size_t i = 0; hit && i < group.size(); ++i) {
      if (!pred[i].empty()) continue;
      std::vector<std::string> letters;
      for (const auto& [c, v] : group[i]->choices) letters.emplace_back(1, c);
      const std::string p = mmbench_extract_mcq(group[i]->prediction, letters);
      if (p.empty() || p != group[i]->answer) hit = 0;
    }
    hits += hit, ++questions;
    Json copies = Json::array();
    for (size_t i = 0; i < group.size(); ++i)
      copies.push_back(
          {{"index", group[i]->index}, {"prediction", group[i]->prediction}, {"parsed", pred[i]}});
    r.per_question.push_back({{"id", idx}, {"copies", copies}, {"score", hit}});
    by_cat[main.category].first += hit, ++by_cat[main.category].second;
    by_l2[main.l2].first += hit, ++by_l2[main.l2].second;
  }
  auto rates = [](const std::map<std::string, std::pair<int64_t, int64_t>>& m) {
    Json j = Json::object();
    for (const auto& [k, v] : m) j[k] = static_cast<double>(v.first) / static_cast<double>(v.second);
    return j;
  };
  const double acc = questions ? static_cast<double>(hits) / static_cast<double>(questions) : 0.0;
  r.figures["questions"] = questions;
  r.figures["hits"] = hits;
  r.figures["accuracy"] = acc;
  r.figures["category"] = rates(by_cat);
  r.figures["l2_category"] = rates(by_l2);
  r.lines.push_back("questions  " + std::to_string(questions) + " (circular: every copy must be right)");
  r.lines.push_back("accuracy   " + percent(acc) + " (" + std::to_string(hits) + " right)");
  for (const auto& [k, v] : by_l2)
    r.lines.push_back("  " + k + "  " +
                      percent(static_cast<double>(v.first) / static_cast<double>(v.second)));
  return r;
}

}  // namespace gmod::eval

// MMMU answer parsing and matching (see mmmu_parse.h).
#include "eval/mmmu_parse.h"

#include <algorithm>

#include "eval/pystr.h"
#include "eval/regex.h"

namespace gmod::eval::mmmu {

std::string parse_multi_choice(const std::string& response_in, const std::vector<std::string>& all_choices,
                               const std::vector<std::pair<std::string, std::string>>& index2ans,
                               PyRandom& rng, bool* random_used) {
  std::string response = response_in;
  for (const char* c : {",", ".", "!", "?", ";", ":", "'"}) response = py::strip_chars(response, c);
  response = " " + response + " ";
  bool index_ans = true, with_brackets = false;
  std::vector<std::string> cands;
  for (const std::string& c : all_choices)
    if (response.find("(" + c + ")") != std::string::npos) cands.push_back(c), with_brackets = true;
  if (cands.empty())
    for (const std::string& c : all_choices)
      if (response.find(" " + c + " ") != std::string::npos) cands.push_back(c);
  const std::string lower = py::lower(response);
  if (cands.empty() && py::split_ws(response).size() > 5)
    for (const auto& [index, ans] : index2ans)
      if (lower.find(py::lower(ans)) != std::string::npos) cands.push_back(index), index_ans = false;
  *random_used = cands.empty();
  if (cands.empty()) return all_choices[rng.below(static_cast<uint32_t>(all_choices.size()))];
  if (cands.size() == 1) return cands[0];
  // the candidate found last (the first of equal positions, as np.argmax); rfind's -1 for "not found"
  long best = -2;
  std::string pick;
  for (const std::string& c : cands) {
    size_t at = std::string::npos;
    if (index_ans) {
      at = response.rfind(with_brackets ? "(" + c + ")" : " " + c + " ");
    } else {
      const auto it =
          std::find_if(index2ans.begin(), index2ans.end(), [&](const auto& p) { return p.first == c; });
      at = lower.rfind(py::lower(it->second));
    }
    const long pos = at == std::string::npos ? -1 : static_cast<long>(at);
    if (pos > best) best = pos, pick = c;
  }
  return pick;
}

std::vector<Value> normalize(const std::string& s_in) {
  const std::string s = py::strip(s_in);
  double x = 0;
  if (py::parse_float(py::replace(s, ",", ""), &x)) return {Value{true, py::round2(x), ""}};
  const std::string l = py::lower(s);
  if (py::length(l) == 1) return {Value{false, 0, " " + l}, Value{false, 0, l + " "}};
  return {Value{false, 0, l}};
}

std::vector<std::string> extract_numbers(const std::string& s) {
  static const Regex with_commas(R"(-?\b\d{1,3}(?:,\d{3})+\b)");
  static const Regex scientific(R"(-?\d+(?:\.\d+)?[eE][+-]?\d+)");
  static const Regex simple(R"(-?(?:\d+\.\d+|\.\d+|\d+\b)(?![eE][+-]?\d+)(?![,\d]))");
  std::vector<std::string> out = with_commas.findall(s);
  for (auto& x : scientific.findall(s)) out.push_back(std::move(x));
  for (auto& x : simple.findall(s)) out.push_back(std::move(x));
  return out;
}

namespace {

// get_key_subresponses of parse_open_response.
std::vector<std::string> key_subresponses(const std::string& response_in) {
  static const Regex sentence(R"(\.\s(?=[A-Z])|\n)");
  const std::string response = py::lower(py::strip_chars(py::strip(response_in), "."));
  const std::vector<std::string> subs = sentence.split(response);
  std::vector<std::string> indicators = {"could be ",  "so ",    "is ",     "thus ",
                                         "therefore ", "final ", "answer ", "result "};
  std::vector<std::string> keys;
  for (size_t i = 0; i < subs.size(); ++i) {
    if (i + 1 == subs.size()) indicators.push_back("=");
    const std::string& resp = subs[i];
    std::string shortest;
    bool have = false;  // Python's "if not shortest": None and "" are both falsy
    for (const std::string& ind : indicators) {
      if (resp.find(ind) == std::string::npos) continue;
      const std::string tail = py::strip(py::split(resp, ind).back());
      if (!have || shortest.empty())
        shortest = tail, have = true;
      else if (py::length(tail) < py::length(shortest))
        shortest = tail;
    }
    static const std::vector<std::string> trivial = {":", ",", ".", "!", "?", ";", "'"};
    if (!shortest.empty() && std::find(trivial.begin(), trivial.end(), py::strip(shortest)) == trivial.end())
      keys.push_back(shortest);
  }
  if (keys.empty()) return {response};
  return keys;
}

}  // namespace

std::vector<Value> parse_open(const std::string& response) {
  const std::vector<std::string> keys = key_subresponses(response);
  std::vector<std::string> preds = keys;
  for (const std::string& k : keys)
    for (auto& n : extract_numbers(k)) preds.push_back(std::move(n));
  std::vector<Value> out;
  for (const std::string& p : preds)
    for (Value& v : normalize(p))
      if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(std::move(v));
  return out;
}

bool eval_open(const std::vector<std::string>& gold, const std::vector<Value>& pred) {
  std::vector<Value> norm;
  for (const std::string& g : gold)
    for (Value& v : normalize(g)) norm.push_back(std::move(v));
  for (const Value& p : pred) {
    if (!p.is_number) {
      for (const Value& n : norm)
        if (!n.is_number && p.text.find(n.text) != std::string::npos) return true;
    } else {
      for (const Value& n : norm)
        if (n.is_number && n.number == p.number) return true;
    }
  }
  return false;
}

}  // namespace gmod::eval::mmmu

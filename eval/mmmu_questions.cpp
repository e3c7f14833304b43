// MMMU's samples as asked by γ-MoD's MMMU script (see mmmu_questions.h).
#include "eval/mmmu_questions.h"

#include <stdexcept>

namespace gmod::eval {
namespace {

void skip_space(const std::string& s, size_t* i) {
  while (*i < s.size() && (s[*i] == ' ' || s[*i] == '\t' || s[*i] == '\n' || s[*i] == '\r')) ++*i;
}

}  // namespace

std::vector<std::string> parse_python_string_list(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  auto fail = [&](const std::string& what) {
    throw std::invalid_argument("not a Python list of strings at character " + std::to_string(i) + ": " +
                                what);
  };
  skip_space(s, &i);
  if (i >= s.size() || s[i] != '[') fail("expected '['");
  ++i;
  skip_space(s, &i);
  if (i < s.size() && s[i] == ']') {
    ++i;
  } else {
    for (;;) {
      skip_space(s, &i);
      if (i >= s.size() || (s[i] != '\'' && s[i] != '"')) fail("expected a quoted string");
      const char quote = s[i++];
      std::string v;
      for (;;) {
        if (i >= s.size()) fail("unterminated string");
        const char c = s[i++];
        if (c == quote) break;
        if (c != '\\') {
          v += c;
          continue;
        }
        if (i >= s.size()) fail("unterminated string");
        const char e = s[i++];
        switch (e) {  // Python's escapes; an unknown one keeps its backslash, as Python does
          case '\\':
            v += '\\';
            break;
          case '\'':
            v += '\'';
            break;
          case '"':
            v += '"';
            break;
          case 'n':
            v += '\n';
            break;
          case 't':
            v += '\t';
            break;
          case 'r':
            v += '\r';
            break;
          case '\n':
            break;
          default:
            v += '\\', v += e;
        }
      }
      out.push_back(std::move(v));
      skip_space(s, &i);
      if (i < s.size() && s[i] == ',') {
        ++i;
        skip_space(s, &i);
        if (i < s.size() && s[i] == ']') {
          ++i;
          break;
        }
        continue;
      }
      if (i < s.size() && s[i] == ']') {
        ++i;
        break;
      }
      fail("expected ',' or ']'");
    }
  }
  skip_space(s, &i);
  if (i != s.size()) fail("text after the list");
  return out;
}

bool read_mmmu_question(const Record& r, MmmuQuestion* q, std::vector<Problem>* problems) {
  *q = MmmuQuestion();
  const std::string* id = string_field(r, "id", problems);
  const std::string* question = string_field(r, "question", problems);
  const std::string* type = string_field(r, "question_type", problems);
  if (!id || !question || !type) return false;
  q->id = *id;
  q->where = r.where;
  const Json& answer = r.value.contains("answer") ? r.value["answer"] : Json();
  if (!answer.is_string() && !answer.is_array()) {
    problems->push_back({r.where, "no 'answer' (a string or a list of strings)"});
    return false;
  }
  q->fields = {{"question_type", *type}, {"answer", answer}};
  if (r.value.contains("image_1") && !r.value["image_1"].is_null()) {
    if (!r.value["image_1"].is_string()) {
      problems->push_back({r.where, "'image_1' is not a string (the image's path)"});
      return false;
    }
    q->image = r.value["image_1"].get<std::string>();
  }
  if (*type != "multiple-choice") {
    q->text = *question + "\nAnswer the question using a single word or phrase.";
    return true;
  }
  std::vector<std::string> options;
  const Json& o = r.value.contains("options") ? r.value["options"] : Json();
  try {
    if (o.is_string()) {
      options = parse_python_string_list(o.get<std::string>());
    } else if (o.is_array()) {
      for (const Json& v : o) {
        if (!v.is_string()) throw std::invalid_argument("an option is not a string");
        options.push_back(v.get<std::string>());
      }
    } else {
      throw std::invalid_argument("missing");
    }
    if (options.empty() || options.size() > 26) throw std::invalid_argument("no options, or more than 26");
  } catch (const std::exception& e) {
    problems->push_back({r.where, std::string("'options' of a multiple-choice question: ") + e.what()});
    return false;
  }
  std::string listing;
  Json choices = Json::array(), index2ans = Json::object();
  for (size_t k = 0; k < options.size(); ++k) {
    const std::string letter(1, static_cast<char>('A' + k));
    listing += "(" + letter + ") " + options[k] + "\n";
    choices.push_back(letter);
    index2ans[letter] = options[k];
  }
  q->text = *question + "\n" + listing + "\nAnswer with the option's letter from the given choices directly.";
  q->fields["all_choices"] = choices;
  q->fields["index2ans"] = index2ans;
  return true;
}

}  // namespace gmod::eval

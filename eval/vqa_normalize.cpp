// VQA answer normalisation (see vqa_normalize.h).
#include "eval/vqa_normalize.h"

#include <unordered_map>
#include <vector>

#include "eval/pystr.h"
#include "eval/regex.h"

namespace gmod::eval {
namespace {

// The VQA evaluation's contraction table (data the results depend on; entries as the evaluator has them,
// including its odd ones such as "somebody'd" -> "somebodyd").
const std::unordered_map<std::string, std::string>& contractions() {
  static const std::unordered_map<std::string, std::string> m = {
      {"aint", "ain't"},
      {"arent", "aren't"},
      {"cant", "can't"},
      {"couldve", "could've"},
      {"couldnt", "couldn't"},
      {"couldn'tve", "couldn't've"},
      {"couldnt've", "couldn't've"},
      {"didnt", "didn't"},
      {"doesnt", "doesn't"},
      {"dont", "don't"},
      {"hadnt", "hadn't"},
      {"hadnt've", "hadn't've"},
      {"hadn'tve", "hadn't've"},
      {"hasnt", "hasn't"},
      {"havent", "haven't"},
      {"hed", "he'd"},
      {"hed've", "he'd've"},
      {"he'dve", "he'd've"},
      {"hes", "he's"},
      {"howd", "how'd"},
      {"howll", "how'll"},
      {"hows", "how's"},
      {"Id've", "I'd've"},
      {"I'dve", "I'd've"},
      {"Im", "I'm"},
      {"Ive", "I've"},
      {"isnt", "isn't"},
      {"itd", "it'd"},
      {"itd've", "it'd've"},
      {"it'dve", "it'd've"},
      {"itll", "it'll"},
      {"let's", "let's"},
      {"maam", "ma'am"},
      {"mightnt", "mightn't"},
      {"mightnt've", "mightn't've"},
      {"mightn'tve", "mightn't've"},
      {"mightve", "might've"},
      {"mustnt", "mustn't"},
      {"mustve", "must've"},
      {"neednt", "needn't"},
      {"notve", "not've"},
      {"oclock", "o'clock"},
      {"oughtnt", "oughtn't"},
      {"ow's'at", "'ow's'at"},
      {"'ows'at", "'ow's'at"},
      {"'ow'sat", "'ow's'at"},
      {"shant", "shan't"},
      {"shed've", "she'd've"},
      {"she'dve", "she'd've"},
      {"she's", "she's"},
      {"shouldve", "should've"},
      {"shouldnt", "shouldn't"},
      {"shouldnt've", "shouldn't've"},
      {"shouldn'tve", "shouldn't've"},
      {"somebody'd", "somebodyd"},
      {"somebodyd've", "somebody'd've"},
      {"somebody'dve", "somebody'd've"},
      {"somebodyll", "somebody'll"},
      {"somebodys", "somebody's"},
      {"someoned", "someone'd"},
      {"someoned've", "someone'd've"},
      {"someone'dve", "someone'd've"},
      {"someonell", "someone'll"},
      {"someones", "someone's"},
      {"somethingd", "something'd"},
      {"somethingd've", "something'd've"},
      {"something'dve", "something'd've"},
      {"somethingll", "something'll"},
      {"thats", "that's"},
      {"thered", "there'd"},
      {"thered've", "there'd've"},
      {"there'dve", "there'd've"},
      {"therere", "there're"},
      {"theres", "there's"},
      {"theyd", "they'd"},
      {"theyd've", "they'd've"},
      {"they'dve", "they'd've"},
      {"theyll", "they'll"},
      {"theyre", "they're"},
      {"theyve", "they've"},
      {"twas", "'twas"},
      {"wasnt", "wasn't"},
      {"wed've", "we'd've"},
      {"we'dve", "we'd've"},
      {"weve", "we've"},
      {"werent", "weren't"},
      {"whatll", "what'll"},
      {"whatre", "what're"},
      {"whats", "what's"},
      {"whatve", "what've"},
      {"whens", "when's"},
      {"whered", "where'd"},
      {"wheres", "where's"},
      {"whereve", "where've"},
      {"whod", "who'd"},
      {"whod've", "who'd've"},
      {"who'dve", "who'd've"},
      {"wholl", "who'll"},
      {"whos", "who's"},
      {"whove", "who've"},
      {"whyll", "why'll"},
      {"whyre", "why're"},
      {"whys", "why's"},
      {"wont", "won't"},
      {"wouldve", "would've"},
      {"wouldnt", "wouldn't"},
      {"wouldnt've", "wouldn't've"},
      {"wouldn'tve", "wouldn't've"},
      {"yall", "y'all"},
      {"yall'll", "y'all'll"},
      {"y'allll", "y'all'll"},
      {"yall'd've", "y'all'd've"},
      {"y'alld've", "y'all'd've"},
      {"y'all'dve", "y'all'd've"},
      {"youd", "you'd"},
      {"youd've", "you'd've"},
      {"you'dve", "you'd've"},
      {"youll", "you'll"},
      {"youre", "you're"},
      {"youve", "you've"},
  };
  return m;
}

const std::unordered_map<std::string, std::string>& number_words() {
  static const std::unordered_map<std::string, std::string> m = {
      {"none", "0"}, {"zero", "0"}, {"one", "1"},   {"two", "2"},   {"three", "3"}, {"four", "4"},
      {"five", "5"}, {"six", "6"},  {"seven", "7"}, {"eight", "8"}, {"nine", "9"},  {"ten", "10"}};
  return m;
}

// The punctuation marks, in the order the evaluator treats them ('.' is handled separately).
const char* const kPunctuation[] = {";",  "/", "[", "]", "\"", "{", "}", "(", ")", "=", "+",
                                    "\\", "_", "-", ">", "<",  "@", "`", ",", "?", "!"};

}  // namespace

std::string vqa_process_punctuation(const std::string& in, VqaCommaRule comma) {
  static const Regex m4c_comma(R"((?<=\d)(,)+(?=\d))");  // m4c's COMMA_STRIP
  static const Regex vqaeval_comma(R"((\d)(,)(\d))");    // VQAEval's commaStrip
  // The original's period pattern starts with a lookahead that never fails at a '.', so it is: a '.' not
  // followed by a digit.
  static const Regex period(R"(\.(?!\d))");
  const bool digit_commas = (comma == VqaCommaRule::kM4c ? m4c_comma : vqaeval_comma).search(in);
  std::string out = in;
  for (const char* p : kPunctuation) {
    const std::string ps(p);
    const bool spaced = in.find(ps + " ") != std::string::npos || in.find(" " + ps) != std::string::npos;
    out = py::replace(out, ps, spaced || digit_commas ? "" : " ");
  }
  return period.sub(out, "", /*count=*/32);  // the original passes re.UNICODE (32) as the count
}

std::string vqa_process_digit_article(const std::string& in) {
  std::vector<std::string> words;
  for (std::string w : py::split_ws(py::lower(in))) {
    const auto n = number_words().find(w);
    if (n != number_words().end()) w = n->second;
    if (w != "a" && w != "an" && w != "the") words.push_back(w);
  }
  for (std::string& w : words) {
    const auto c = contractions().find(w);
    if (c != contractions().end()) w = c->second;
  }
  return py::join(words, " ");
}

std::string normalize_vqa_answer(std::string_view answer) {
  std::string s = py::lower(answer);
  s = py::replace(py::replace(s, ",", ""), "?", "");
  s = py::strip(py::replace(s, "'s", " 's"));
  s = py::strip(py::replace(py::replace(s, "\n", " "), "\t", " "));
  return vqa_process_digit_article(vqa_process_punctuation(s, VqaCommaRule::kM4c));
}

}  // namespace gmod::eval

// The Python building blocks the scorers rely on, against Python itself (tests/fixtures/score/python.json and
// normalize.json, made by tests/fixtures/make_score_fixtures.py): float() syntax, round(x, 2),
// random.seed(42) + random.choice, str.lower/split/strip/isalpha and float() on non-ASCII text, and the m4c
// evaluator's and VQAEval's answer processing of every awkward answer the fixtures use.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "eval/py_random.h"
#include "eval/pystr.h"
#include "eval/records.h"
#include "eval/regex.h"
#include "eval/score_vqaeval.h"
#include "eval/vqa_normalize.h"
#include "tests/common/paths.h"

namespace gmod::eval {
namespace {

Json fixture_json(const std::string& rel) { return read_json(test::fixture("score/" + rel)); }

std::string g17(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

TEST(PythonSemantics, FloatSyntaxAsPythonFloat) {
  const Json f = fixture_json("python.json")["float"];
  ASSERT_GT(f.size(), 10u);
  for (const Json& c : f) {
    double v = 0;
    const bool ok = py::parse_float(c["in"].get<std::string>(), &v);
    EXPECT_EQ(ok, c["ok"].get<bool>()) << "float(\"" << c["in"].get<std::string>() << "\")";
    if (ok && c["ok"].get<bool>()) {
      EXPECT_EQ(g17(v), c["value"].get<std::string>()) << c["in"];
    }
  }
}

// (The list is held in a local: `for (c : fixture_json(..)["k"])` would walk a destroyed temporary.)
TEST(PythonSemantics, RoundToTwoDecimalsAsPython) {
  const Json cases = fixture_json("python.json")["round2"];
  ASSERT_GT(cases.size(), 5u);
  for (const Json& c : cases)
    EXPECT_EQ(g17(py::round2(std::strtod(c["in"].get<std::string>().c_str(), nullptr))),
              c["out"].get<std::string>())
        << "round(" << c["in"].get<std::string>() << ", 2)";
}

TEST(PythonSemantics, RoundToThreeDecimalsAsPython) {
  const Json cases = fixture_json("python.json")["round3"];
  ASSERT_FALSE(cases.empty());
  for (const Json& c : cases)
    EXPECT_EQ(g17(py::round_to(std::strtod(c["in"].get<std::string>().c_str(), nullptr), 3)),
              c["out"].get<std::string>())
        << "round(" << c["in"].get<std::string>() << ", 3)";
}

// str.lower(), str.split(), str.strip(), str.isalpha(), float() and re's \s, \S, \w, \d on non-ASCII text, as
// Python gives them.
TEST(PythonSemantics, UnicodeCaseSpacesLettersAndDigitsAsPython) {
  const Json cases = fixture_json("python.json")["unicode"];
  ASSERT_GT(cases.size(), 30u);
  for (const Json& c : cases) {
    const std::string in = c["in"].get<std::string>();
    EXPECT_EQ(py::lower(in), c["lower"].get<std::string>()) << "\"" << in << "\".lower()";
    EXPECT_EQ(Json(py::split_ws(in)), c["split"]) << "\"" << in << "\".split()";
    EXPECT_EQ(py::strip(in), c["strip"].get<std::string>()) << "\"" << in << "\".strip()";
    EXPECT_EQ(py::isalpha(in), c["isalpha"].get<bool>()) << "\"" << in << "\".isalpha()";
    static const Regex spaces(R"(\s+)"), words(R"(\w+)"), digit(R"(\d)"), non_spaces(R"(\S+)");
    EXPECT_EQ(Json(spaces.split(in)), c["re_split_s"]) << "re.split(r'\\s+', \"" << in << "\")";
    EXPECT_EQ(Json(words.findall(in)), c["re_findall_w"]) << "re.findall(r'\\w+', \"" << in << "\")";
    EXPECT_EQ(Json(digit.findall(in)), c["re_findall_d"]) << "re.findall(r'\\d', \"" << in << "\")";
    EXPECT_EQ(Json(non_spaces.findall(in)), c["re_findall_S"]) << "re.findall(r'\\S+', \"" << in << "\")";
    double v = 0;
    const bool ok = py::parse_float(in, &v);
    EXPECT_EQ(ok, !c["float"].is_null()) << "float(\"" << in << "\")";
    if (ok && !c["float"].is_null()) {
      EXPECT_EQ(g17(v), c["float"].get<std::string>()) << "float(\"" << in << "\")";
    }
  }
}

TEST(PythonSemantics, RandomChoiceSeeded42AsPython) {
  PyRandom rng(42);
  const Json cases = fixture_json("python.json")["choice_seed42"];
  ASSERT_GT(cases.size(), 10u);
  for (const Json& c : cases)
    EXPECT_EQ(rng.below(c["n"].get<uint32_t>()), c["pick"].get<uint32_t>()) << "choice of " << c["n"];
}

TEST(PythonSemantics, StripAndSplitUsePythonWhitespace) {
  EXPECT_EQ(py::strip("\x1c a b\xc2\xa0"), "a b");  // \x1c and U+00A0 are str.isspace()
  EXPECT_EQ(py::split_ws(" a\u3000b\tc ").size(), 3u);
  EXPECT_EQ(py::split("a..b", "."), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_EQ(py::strip_chars("..a.b..", "."), "a.b");
}

TEST(VqaNormalize, EqualsTheM4cEvaluatorOnEveryAwkwardAnswer) {
  const Json cases = fixture_json("normalize.json");
  ASSERT_GT(cases.size(), 80u);
  for (const Json& c : cases)
    EXPECT_EQ(normalize_vqa_answer(c["in"].get<std::string>()), c["out"].get<std::string>())
        << "answer \"" << c["in"].get<std::string>() << "\"";
}

// VQAEval.evaluate's processing of a prediction (γ-MoD's vqa_eval.py): its own digit-comma rule, no "'s"
// split.
TEST(VqaNormalize, PredictionEqualsVqaEvalOnEveryAwkwardAnswer) {
  const Json cases = fixture_json("normalize.json");
  ASSERT_GT(cases.size(), 80u);
  for (const Json& c : cases)
    EXPECT_EQ(vqaeval_prediction(c["in"].get<std::string>()), c["vqaeval"].get<std::string>())
        << "answer \"" << c["in"].get<std::string>() << "\"";
}

}  // namespace
}  // namespace gmod::eval

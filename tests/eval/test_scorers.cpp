// Every scorer against the original Python scoring code on the same generated answer files
// (tests/fixtures/score/<benchmark>/expected.json, made by tests/fixtures/make_score_fixtures.py): counts
// exact, averages within 1e-12 relative. The "dirty" answer files are the same answers with malformed records
// inserted: the figures must not change and every inserted record must be named by its line.
#include <map>
#include <set>

#include "eval/score_mmbench.h"
#include "tests/eval/score_fixture.h"

namespace gmod::eval {
namespace {

using namespace test_fixture;

class Scorer : public ::testing::TestWithParam<std::string> {};

TEST_P(Scorer, FiguresEqualTheOriginalScript) {
  const std::string b = GetParam();
  const Json want = read_json(dir(b) + "/expected.json");
  const ScoreResult r = score(b, inputs(b, b == "mmmu" ? "output.json" : "answers.jsonl"));
  expect_figures(r.figures, want, b);
  expect_problems(r, want.contains("problems") ? want["problems"] : Json::array(), "");
}

class DirtyAnswers : public ::testing::TestWithParam<std::string> {};

TEST_P(DirtyAnswers, MalformedRecordsAreNamedAndLeaveTheFiguresAlone) {
  const std::string b = GetParam();
  const Json want = read_json(dir(b) + "/expected.json");
  const ScoreInputs in = inputs(b, "answers_dirty.jsonl");
  const ScoreResult r = score(b, in);
  expect_figures(r.figures, want, b + " (dirty)");
  Json all = want.contains("problems") ? want["problems"] : Json::array();
  for (const Json& p : want["dirty_problems"]) all.push_back(p);
  expect_problems(r, all, in.answers);
}

INSTANTIATE_TEST_SUITE_P(Benchmarks, Scorer,
                         ::testing::Values("textvqa", "vqav2", "gqa", "scienceqa", "pope", "mme", "mmbench",
                                           "mmmu"));
INSTANTIATE_TEST_SUITE_P(Benchmarks, DirtyAnswers,
                         ::testing::Values("textvqa", "vqav2", "gqa", "scienceqa", "pope", "mme", "mmbench"));

std::string fmt_g17(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

// Per record: the letter or the set of open-answer candidates MMMU's parser produced, and its judgement (the
// random picks of unparsable answers included).
TEST(MmmuRecords, ParsedAnswersEqualTheOriginalPerRecord) {
  const Json want = read_json(dir("mmmu") + "/expected.json")["parsed"];
  const ScoreResult r = score("mmmu", inputs("mmmu", "output.json"));
  const Json& got = r.figures["parsed"];
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i]["id"], want[i]["id"]);
    EXPECT_EQ(got[i]["correct"], want[i]["correct"]) << want[i]["id"];
    if (want[i]["parsed_pred"].is_string()) {
      EXPECT_EQ(got[i]["parsed_pred"], want[i]["parsed_pred"]) << want[i]["id"];
      continue;
    }
    std::set<std::string> g, w;
    for (const Json& v : got[i]["parsed_pred"])
      g.insert(v.is_string() ? "s:" + v.get<std::string>() : "n:" + fmt_g17(v.get<double>()));
    for (const Json& v : want[i]["parsed_pred"]) w.insert(v.get<std::string>());
    EXPECT_EQ(g, w) << want[i]["id"];
  }
}

// Per answer: the letter MMBench's can_infer and lmms-eval's extract_mcq_answer read, for 2, 3 and 4 options.
TEST(MmbenchLetters, InferredAndExtractedLettersEqualTheOriginals) {
  const Json want = read_json(dir("mmbench") + "/expected.json")["letters"];
  ASSERT_GT(want.size(), 100u);
  const std::vector<std::string> options = {"teddy bear", "rabbit", "cat", "dog"};
  for (const Json& c : want) {
    const int n = c["choices"].get<int>();
    std::map<char, std::string> choices;
    std::vector<std::string> letters;
    for (int j = 0; j < n; ++j) choices["ABCD"[j]] = options[j], letters.emplace_back(1, "ABCD"[j]);
    const std::string p = c["prediction"].get<std::string>();
    EXPECT_EQ(mmbench_can_infer(p, choices), c["can_infer"].get<std::string>())
        << "\"" << p << "\", " << n << " options";
    EXPECT_EQ(mmbench_extract_mcq(p, letters), c["extract"].get<std::string>())
        << "\"" << p << "\", " << n << " options";
  }
}

TEST(ScoreInputs, MissingInputsAndUnknownBenchmarkAreUsageErrors) {
  EXPECT_THROW(score("vizwiz", inputs("gqa")), std::invalid_argument);
  ScoreInputs in = inputs("pope");
  in.questions.clear();
  EXPECT_THROW(score("pope", in), std::invalid_argument);
  in = inputs("gqa");
  in.annotations = {dir("gqa") + "/no_such.json"};
  try {
    score("gqa", in);
    FAIL() << "no error for a missing file";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no_such.json"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gmod::eval

// The "cases" of tests/fixtures/score/<benchmark>/expected.json (tests/fixtures/score_fixtures_gamma.py): more
// answer files and rules, each scored by the original script (γ-MoD's VQA + VQAEval, γ-MoD's and LLaVA's
// eval_science_qa.py, γ-MoD's eval_mmmu_only.py). gmod must give its figures (unrounded within 1e-12 relative,
// rounded ones exactly and in the same order), its per-question values, and name exactly the listed problems;
// where the original stops (a question missing, an id its answer dict lacks) gmod names why.
#include "tests/eval/score_fixture.h"

namespace gmod::eval {
namespace {

using namespace test_fixture;

class Cases : public ::testing::TestWithParam<std::string> {};

TEST_P(Cases, FiguresPerQuestionValuesAndProblemsEqualTheOriginal) {
  const std::string b = GetParam();
  const Json want = read_json(dir(b) + "/expected.json");
  ASSERT_TRUE(want.contains("cases")) << b;
  ASSERT_FALSE(want["cases"].empty());
  for (const Json& c : want["cases"]) {
    ScoreInputs in = inputs(b, c["answers"].get<std::string>());
    if (c.contains("rule")) in.rule = c["rule"].get<std::string>();
    if (c.contains("questions")) in.questions = dir(b) + "/vqav2_questions.json";
    if (c.contains("annotations")) in.annotations = {dir(b) + "/" + c["annotations"].get<std::string>()};
    const std::string what = b + " " + c["answers"].get<std::string>() + " rule " + (in.rule.empty() ? "default" : in.rule) +
                             (in.questions.empty() ? "" : " with --questions");
    SCOPED_TRACE(what);
    const ScoreResult r = score(b, in);
    if (c.contains("figures")) expect_figures(r.figures, c["figures"], what);
    if (c.contains("rounded")) expect_figures(r.figures, c["rounded"], what + " (rounded)", /*exact=*/true);
    if (c.contains("per_question")) expect_per_question(r.per_question, c["per_question"], what);
    expect_problems(r, c["problems"], in.answers);
  }
}

INSTANTIATE_TEST_SUITE_P(Benchmarks, Cases, ::testing::Values("vqav2", "scienceqa", "mmmu"));

}  // namespace
}  // namespace gmod::eval

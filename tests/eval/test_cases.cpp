// The "cases" of tests/fixtures/score/<benchmark>/expected.json (tests/fixtures/score_fixtures_gamma.py):
// more answer files and rules, each scored by the original script (γ-MoD's VQA + VQAEval, γ-MoD's and LLaVA's
// eval_science_qa.py, γ-MoD's eval_mmmu_only.py). gmod must give its figures (unrounded within 1e-12
// relative, rounded ones exactly and in the same order), its per-question values, and name exactly the listed
// problems; where the original stops (a question missing, an id its answer dict lacks) gmod names why.
#include <filesystem>
#include <fstream>

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
    if (c.contains("questions"))
      in.questions = dir(b) + "/" +
                     (c["questions"].is_string() ? c["questions"].get<std::string>()
                                                 : std::string("vqav2_questions.json"));
    if (c.contains("annotations")) in.annotations = {dir(b) + "/" + c["annotations"].get<std::string>()};
    const std::string what = b + " " + c["answers"].get<std::string>() + " rule " +
                             (in.rule.empty() ? "default" : in.rule) +
                             (in.questions.empty() ? "" : " with --questions");
    SCOPED_TRACE(what);
    const ScoreResult r = score(b, in);
    if (c.contains("figures")) expect_figures(r.figures, c["figures"], what);
    if (c.contains("rounded")) expect_figures(r.figures, c["rounded"], what + " (rounded)", /*exact=*/true);
    if (c.contains("per_question")) expect_per_question(r.per_question, c["per_question"], what);
    expect_problems(r, c["problems"], in.answers);
  }
}

INSTANTIATE_TEST_SUITE_P(Benchmarks, Cases,
                         ::testing::Values("textvqa", "vqav2", "scienceqa", "pope", "mme", "mmmu"));

bool names(const ScoreResult& r, const std::string& where, const std::string& word) {
  for (const Problem& p : r.problems)
    if (p.where == where && p.what.find(word) != std::string::npos) return true;
  return false;
}

// An option the benchmark does not read is a named problem, and its figures are those without it.
TEST(Options, ThatDoNotApplyAreNamedProblems) {
  ScoreInputs in = inputs("gqa");
  in.split = "val", in.questions = dir("gqa") + "/questions.json";
  ScoreResult r = score("gqa", in);
  EXPECT_TRUE(names(r, "--split", "does not apply")) << problems_text(r);
  EXPECT_TRUE(names(r, "--questions", "does not apply")) << problems_text(r);
  EXPECT_EQ(r.problems.size(), 2u) << problems_text(r);
  EXPECT_EQ(r.figures["correct"], read_json(dir("gqa") + "/expected.json")["correct"]);
  in = inputs("mmmu", "output.json");
  in.annotations = {dir("mmmu") + "/answer_dict.json"};  // parse-and-eval records carry their answers
  r = score("mmmu", in);
  EXPECT_TRUE(names(r, "--annotations", "does not apply")) << problems_text(r);
  EXPECT_EQ(r.problems.size(), 1u) << problems_text(r);
  in = inputs("textvqa");
  in.rule = "vqaeval";
  EXPECT_THROW(score("textvqa", in), std::invalid_argument);
  in = inputs("scienceqa");
  in.split = "val";  // applies: the one problem of split val, 999, has no answer
  r = score("scienceqa", in);
  EXPECT_EQ(r.figures["count"], 1);
  EXPECT_FALSE(names(r, "--split", "does not apply")) << problems_text(r);
}

// POPE's means are gmod's own (eval_pope.py prints each split): each says over how many splits it is, and a
// split without an F1 (eval_pope.py divides by zero there) is named.
TEST(Pope, SummaryCountsTheSplitsOfEachMean) {
  gmod::test::TempDir d;
  const std::string src = dir("pope");
  std::filesystem::create_directories(d.path / "coco");
  for (const char* c : {"adversarial", "popular", "random"})
    std::filesystem::copy_file(src + "/coco/coco_pope_" + c + ".json",
                               d.path / "coco" / (std::string("coco_pope_") + c + ".json"));
  // every answer of category "random" says no: no 'yes' answer, precision 0/0
  std::vector<Problem> ignored;
  std::string answers;
  for (const Record& q : read_jsonl(src + "/questions.jsonl", &ignored))
    answers += Json({{"question_id", q.value["question_id"]},
                     {"text", q.value["category"] == "random" ? "No" : "Yes"}})
                   .dump() +
               "\n";
  { std::ofstream(d.path / "answers.jsonl") << answers; }
  ScoreInputs in;
  in.answers = (d.path / "answers.jsonl").string();
  in.annotations = {(d.path / "coco").string()};
  in.questions = src + "/questions.jsonl";
  const ScoreResult r = score("pope", in);
  EXPECT_EQ(r.figures["f1_splits"], 2);
  EXPECT_EQ(r.figures["accuracy_splits"], 3);
  EXPECT_NE(r.lines.back().find("over 2 split(s), mean accuracy"), std::string::npos) << r.lines.back();
  EXPECT_NE(r.lines.back().find("over 3 split(s)"), std::string::npos) << r.lines.back();
  EXPECT_TRUE(names(r, (d.path / "coco" / "coco_pope_random.json").string(), "ZeroDivisionError"))
      << problems_text(r);
}

// What cannot be matched is reported per file: characters newer than the originals' Python (3.10, Unicode
// 13.0), and MMBench option cells pandas would read as missing or as numbers.
TEST(Differences, AreReportedPerFileWithTheFirstExamples) {
  gmod::test::TempDir d;
  const std::string answers = (d.path / "a.jsonl").string();
  // U+10570 VITHKUQI CAPITAL LETTER A (Unicode 14.0): cased, a letter
  { std::ofstream(answers) << "{\"question_id\": \"20000\", \"text\": \"x \xF0\x90\x95\xB0\"}\n"; }
  ScoreInputs in = inputs("gqa");
  in.answers = answers;
  ScoreResult r = score("gqa", in);
  EXPECT_TRUE(names(r, answers, "1 character(s) assigned after Unicode 13.0 (U+10570 at line 1)"))
      << problems_text(r);
  const std::string tsv = (d.path / "mmb.tsv").string();
  {
    std::ofstream(tsv) << "index\tquestion\tA\tB\tC\tanswer\tcategory\tL2-category\n"
                       << "0\tq\tNone\t2\tcat\tA\tc\tl\n1\tq\tx\t3\ty\tB\tc\tl\n";
  }
  {
    std::ofstream(answers) << R"({"question_id": 0, "text": "A"})"
                              "\n"
                              R"({"question_id": 1, "text": "B"})"
                              "\n";
  }
  in = ScoreInputs{answers, {tsv}, "", "", ""};
  r = score("mmbench", in);
  EXPECT_TRUE(
      names(r, tsv, "1 option cell(s) pandas reads as missing (first: " + tsv + ":2 column A \"None\")"))
      << problems_text(r);
  EXPECT_TRUE(names(r, tsv, "column B: all 2 options are numbers")) << problems_text(r);
  EXPECT_EQ(r.problems.size(), 2u) << problems_text(r);
}

}  // namespace
}  // namespace gmod::eval

namespace gmod::eval {
namespace {

// Problems are listed by file in the order their first problem was found, then by line: a malformed answer line
// (the answers are read first) comes before the annotations' "no answer" problems, whatever the paths' spelling.
TEST(Problems, AnswerFileLinesComeBeforeTheAnnotationsMissingAnswers) {
  gmod::test::TempDir tmp;
  // By path the annotations (a/...) would come first and hide the answer file's (z/...) problems.
  std::filesystem::create_directories(tmp.str("a"));
  std::filesystem::create_directories(tmp.str("z"));
  std::filesystem::copy_file(dir("textvqa") + "/TextVQA_val.json", tmp.str("a/TextVQA_val.json"));
  const std::string answers = tmp.str("z/answers.jsonl");
  {
    std::ifstream in(dir("textvqa") + "/answers.jsonl");
    std::string first;
    std::getline(in, first);
    std::ofstream out(answers);
    out << first << "\n" << "{not json\n";
  }
  ScoreInputs in = inputs("textvqa");
  in.answers = answers;
  in.annotations = {tmp.str("a/TextVQA_val.json")};
  const ScoreResult r = score("textvqa", in);
  ASSERT_GE(r.problems.size(), 2u) << problems_text(r);
  EXPECT_EQ(r.problems.front().where, answers + ":2") << problems_text(r);
  bool missing = false;
  for (const Problem& p : r.problems) missing = missing || p.where.rfind(answers, 0) != 0;
  EXPECT_TRUE(missing) << "the fixture's other questions have no answer here: " << problems_text(r);
}

}  // namespace
}  // namespace gmod::eval

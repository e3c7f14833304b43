// The question readers of `gmod answer` (eval/questions.h, mme_release.h, mmmu_questions.h): MME's release
// folder in both layouts with its bad lines named; `gmod score mme` on the release folder equals the original
// scorer's figures (tests/fixtures/score/mme, made by lmms-eval's MME code) for answers with the released
// prompts and with LLaVA's prompts; MMMU samples asked as γ-MoD's script asks them; Python list literals read
// as Python reads them; records that `gmod answer` could not ask are named by `gmod score` and stay in its
// denominator.
#include <gtest/gtest.h>

#include <fstream>

#include "eval/mme_release.h"
#include "eval/mmmu_questions.h"
#include "eval/pystr.h"
#include "eval/questions.h"
#include "eval/score.h"
#include "tests/common/paths.h"

namespace gmod::eval {
namespace {

void write(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

TEST(MmeRelease, ReadsBothLayoutsAndNamesBadLines) {
  test::TempDir d;
  write(d.str("mme/color/0001.png"), "x");
  write(d.str("mme/color/0001.txt"), "Is it red? Please answer yes or no.\tYes\nno tab here\n");
  write(d.str("mme/color/0002.txt"), "Is it blue? Please answer yes or no.\tNo\n");  // no image
  write(d.str("mme/artwork/images/10002.jpg"), "x");
  write(d.str("mme/artwork/questions_answers_YN/10002.txt"),
        "Is this artwork titled x? Please answer yes or no.\tYes\nIs it y?  Please answer yes or no.\tNo\n");
  std::vector<Problem> problems;
  const std::vector<MmeQuestion> qs = read_mme_release(d.str("mme"), &problems);
  ASSERT_EQ(qs.size(), 3u);
  EXPECT_EQ(qs[0].category, "artwork");
  EXPECT_EQ(qs[0].image, "artwork/images/10002.jpg");
  EXPECT_EQ(qs[0].file, "10002.txt");
  EXPECT_EQ(qs[1].question, "Is it y?  Please answer yes or no.");
  EXPECT_EQ(qs[2].image, "color/0001.png");
  EXPECT_EQ(qs[2].answer, "Yes");
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_EQ(problems[0].where, d.str("mme/color/0001.txt") + ":2");
  EXPECT_NE(problems[0].what.find("not \"question<TAB>answer\""), std::string::npos);
  EXPECT_EQ(problems[1].where, d.str("mme/color/0002.txt"));
  EXPECT_NE(problems[1].what.find("no image named 0002"), std::string::npos);
  // as LLaVA's llava_mme.jsonl asks them (its first line, code_reasoning/0020.png)
  EXPECT_EQ(mme_llava_text("Is a python code shown in the picture? Please answer yes or no."),
            "Is a python code shown in the picture?\nAnswer the question using a single word or phrase.");
  EXPECT_EQ(mme_answer_file("artwork/images/10002.jpg"),
            std::make_pair(std::string("artwork"), std::string("10002.txt")));
  EXPECT_EQ(
      mme_released_questions("Is it y?\nAnswer the question using a single word or phrase."),
      (std::vector<std::string>{"Is it y? Please answer yes or no.", "Is it y?  Please answer yes or no."}));
  // gmod answer's records: id and image the release path, LLaVA's text
  problems.clear();
  const std::vector<Question> asked =
      read_questions(d.str("mme"), question_format("auto", d.str("mme")), false, &problems);
  ASSERT_EQ(asked.size(), 3u);
  EXPECT_EQ(asked[2].id, "color/0001.png");
  EXPECT_EQ(asked[2].image, "color/0001.png");
  EXPECT_EQ(asked[2].prompt, "Is it red?\nAnswer the question using a single word or phrase.");
}

// The release folder made from the fixture's truth (one question file per image), scored with the fixture's
// answers as released and as LLaVA asks them: the original's figures either way.
TEST(MmeRelease, ScoringOnTheReleaseFolderEqualsTheOriginal) {
  const std::string fx = test::fixture("score/mme");
  test::TempDir d;
  std::vector<Problem> problems;
  std::map<std::string, std::string> files;
  for (const Record& r : read_jsonl(fx + "/mme_truth.jsonl", &problems)) {
    const std::string id = r.value["question_id"].get<std::string>();
    const auto [cat, file] = mme_answer_file(id);
    files[cat + "/" + file] +=
        r.value["question"].get<std::string>() + "\t" + r.value["answer"].get<std::string>() + "\n";
    write(d.str("mme/" + id), "x");
  }
  for (const auto& [path, text] : files) write(d.str("mme/" + path), text);
  std::string llava;
  for (const Record& r : read_jsonl(fx + "/answers.jsonl", &problems)) {
    Json v = r.value;
    v["prompt"] = mme_llava_text(v["prompt"].get<std::string>());
    llava += v.dump() + "\n";
  }
  write(d.str("llava_answers.jsonl"), llava);
  ASSERT_TRUE(problems.empty());
  const Json want = read_json(fx + "/expected.json");
  for (const std::string& answers : {fx + "/answers.jsonl", d.str("llava_answers.jsonl")}) {
    const ScoreResult r = score("mme", {answers, {d.str("mme")}, "", "", ""});
    EXPECT_TRUE(r.problems.empty()) << answers << ": "
                                    << (r.problems.empty() ? ""
                                                           : r.problems[0].where + ": " + r.problems[0].what);
    EXPECT_NEAR(r.figures["perception"].get<double>(), want["perception"].get<double>(), 1e-9) << answers;
    EXPECT_NEAR(r.figures["cognition"].get<double>(), want["cognition"].get<double>(), 1e-9) << answers;
  }
}

TEST(MmmuQuestions, AskedAsGammaModAsksThem) {
  std::vector<Problem> problems;
  MmmuQuestion q;
  Record r{
      Json::parse(
          R"({"id": "validation_Art_1", "question": "<image 1> Who?", "options": "['Aurelia', \"Ma'tilda\"]",
                           "answer": "B", "question_type": "multiple-choice", "image_1": "img/a.png"})"),
      "m.jsonl:1"};
  ASSERT_TRUE(read_mmmu_question(r, &q, &problems));
  EXPECT_EQ(q.text,
            "<image 1> Who?\n(A) Aurelia\n(B) Ma'tilda\n\nAnswer with the option's letter from the given "
            "choices directly.");
  EXPECT_EQ(q.image, "img/a.png");
  EXPECT_EQ(q.fields["all_choices"], Json::parse(R"(["A", "B"])"));
  EXPECT_EQ(q.fields["index2ans"].dump(), R"({"A":"Aurelia","B":"Ma'tilda"})");
  Record open{
      Json::parse(R"({"id": "validation_Math_2", "question": "How many?", "options": "[]", "answer": "3",
                              "question_type": "open"})"),
      "m.jsonl:2"};
  ASSERT_TRUE(read_mmmu_question(open, &q, &problems));
  EXPECT_EQ(q.text, "How many?\nAnswer the question using a single word or phrase.");
  EXPECT_TRUE(q.image.empty());
  Record bad{Json::parse(R"({"id": "validation_Art_3", "question": "Q", "options": "['a', 'b'", "answer": "A",
                             "question_type": "multiple-choice"})"),
             "m.jsonl:3"};
  EXPECT_FALSE(read_mmmu_question(bad, &q, &problems));
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].where, "m.jsonl:3");
}

// Python's own reading of these literals (ast.literal_eval), written out by hand.
TEST(MmmuQuestions, PythonListLiteralsReadAsPythonReadsThem) {
  EXPECT_EQ(parse_python_string_list(R"(['a', "b's", 'c\'d', 'e\\f', 'g\nh', 'x\qy',])"),
            (std::vector<std::string>{"a", "b's", "c'd", "e\\f", "g\nh", "x\\qy"}));
  EXPECT_EQ(parse_python_string_list("  [ ]  "), std::vector<std::string>{});
  EXPECT_EQ(parse_python_string_list("['$5 < x < 10$', '2/3']"),
            (std::vector<std::string>{"$5 < x < 10$", "2/3"}));
  for (const char* bad : {"", "['a'", "['a' 'b']", "[a]", "['a'] x", "['a',,]"})
    EXPECT_THROW(parse_python_string_list(bad), std::invalid_argument) << bad;
}

// A question `gmod answer` could not ask is in the answer file with an empty answer: scored as the original
// scores it (wrong: in the denominator) and named.
TEST(AnswerProblems, NamedAndScoredAsTheEmptyAnswer) {
  test::TempDir d;
  Question q;
  q.id = "q1";
  q.prompt = "What?";
  const Json ok = answer_record(q, QuestionFormat::kLoader, "red", "m-0", "m");
  q.id = "q2";
  const Json bad = answer_record(q, QuestionFormat::kLoader, "", "m-1", "m", "images/x.png: cannot open");
  EXPECT_EQ(answer_problem(ok), "");
  EXPECT_EQ(bad["metadata"]["problem"], "images/x.png: cannot open");
  write(d.str("a.jsonl"), ok.dump() + "\n" + bad.dump() + "\n");
  write(d.str("gqa.json"), R"({"q1": {"answer": "red"}, "q2": {"answer": "blue"}})");
  const ScoreResult r = score("gqa", {d.str("a.jsonl"), {d.str("gqa.json")}, "", "", ""});
  EXPECT_EQ(r.figures["questions"], 2);
  EXPECT_EQ(r.figures["correct"], 1);
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_EQ(r.problems[0].where, d.str("a.jsonl") + ":2");
  EXPECT_NE(r.problems[0].what.find("not answered (images/x.png: cannot open)"), std::string::npos);
}

}  // namespace
}  // namespace gmod::eval

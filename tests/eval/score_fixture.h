// Helpers of the scorer tests (test_scorers.cpp, test_cases.cpp): the fixture folders made by
// tests/fixtures/make_score_fixtures.py, the inputs of each benchmark, and comparisons of gmod's figures,
// per-question values and problems with what expected.json holds (the originals' figures).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "eval/score.h"
#include "tests/common/paths.h"

namespace gmod::eval::test_fixture {

inline std::string dir(const std::string& b) { return gmod::test::fixture("score/" + b); }

inline ScoreInputs inputs(const std::string& b, const std::string& answers = "answers.jsonl") {
  ScoreInputs in;
  in.answers = dir(b) + "/" + answers;
  if (b == "textvqa") in.annotations = {dir(b) + "/TextVQA_val.json"};
  if (b == "vqav2") in.annotations = {dir(b) + "/vqav2_annotations.json"};
  if (b == "gqa") in.annotations = {dir(b) + "/questions.json"};
  if (b == "scienceqa") in.annotations = {dir(b)};
  if (b == "pope") in.annotations = {dir(b) + "/coco"}, in.questions = dir(b) + "/questions.jsonl";
  if (b == "mme") in.annotations = {dir(b) + "/mme_truth.jsonl"};
  if (b == "mmbench") in.annotations = {dir(b) + "/mmbench_dev.tsv"};
  return in;
}

// Unrounded figures: within 1e-12 relative (one ulp of a mean is far below).
inline bool close(double g, double w) { return std::fabs(g - w) <= 1e-12 * std::max(1.0, std::fabs(w)); }

// Every figure of `want` equals the one of `got` at the same path (`exact`: numbers bit for bit, objects in
// the same key order, as the rounded figures the originals print); the collections one level below the top
// (categories, splits, types) have the same keys. Top-level keys in `skip` are not figures.
inline void expect_figures(const Json& got, const Json& want, const std::string& path, bool exact = false,
                           int depth = 0) {
  if (want.is_object()) {
    ASSERT_TRUE(got.is_object()) << path << ": not an object: " << got.dump();
    const bool same_keys = depth == 1 || (exact && depth > 0);  // the top level: a subset of the figures
    if (same_keys) {
      EXPECT_EQ(got.size(), want.size()) << path << ": keys " << got.dump() << " vs " << want.dump();
    }
    size_t i = 0;
    for (const auto& [k, v] : want.items()) {
      if (depth == 0 &&
          (k == "dirty_problems" || k == "problems" || k == "parsed" || k == "letters" || k == "cases"))
        continue;
      ASSERT_TRUE(got.contains(k)) << path << "." << k << " missing in " << got.dump();
      if (exact && depth > 0 && i < got.size()) {
        EXPECT_EQ(std::next(got.items().begin(), static_cast<long>(i)).key(), k) << path << ": key order";
      }
      ++i;
      expect_figures(got[k], v, path + "." + k, exact, depth + 1);
    }
  } else if (want.is_number_integer() && !exact) {
    ASSERT_TRUE(got.is_number_integer()) << path << ": " << got.dump() << " is not an integer";
    EXPECT_EQ(got.get<int64_t>(), want.get<int64_t>()) << path;
  } else if (want.is_number()) {
    ASSERT_TRUE(got.is_number()) << path << ": " << got.dump();
    const double g = got.get<double>(), w = want.get<double>();
    if (exact) {
      EXPECT_EQ(g, w) << path;
    } else {
      EXPECT_TRUE(close(g, w)) << path << ": " << g << " vs " << w;
    }
  } else {
    EXPECT_EQ(got, want) << path;
  }
}

inline std::string problems_text(const ScoreResult& r) {
  std::string s;
  for (const auto& p : r.problems) s += "  " + p.where + ": " + p.what + "\n";
  return s;
}

// `want` lists the problems: each {line?, key?, contains} matches one problem (at file:line, or whose place
// ends with key) that says `contains`, and there are no others.
inline void expect_problems(const ScoreResult& r, const Json& want, const std::string& file) {
  for (const Json& p : want) {
    const std::string word = p["contains"].get<std::string>();
    const std::string where = p.contains("line") ? file + ":" + std::to_string(p["line"].get<int>()) : "";
    const std::string key = p.contains("key") ? p["key"].get<std::string>() : "";
    bool found = false;
    for (const auto& q : r.problems) {
      const bool at = where.empty() || q.where == where;
      const bool ends = key.empty() || (q.where.size() >= key.size() &&
                                        q.where.compare(q.where.size() - key.size(), key.size(), key) == 0);
      found = found || (at && ends && q.what.find(word) != std::string::npos);
    }
    EXPECT_TRUE(found) << "no problem at '" << where << key << "' saying '" << word << "' in:\n"
                       << problems_text(r);
  }
  EXPECT_EQ(r.problems.size(), want.size()) << problems_text(r);
}

// Per question, in order: every value the original gave (numbers to 1e-12 relative, the rest exactly).
inline void expect_per_question(const Json& got, const Json& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what << ": per-question values";
  for (size_t i = 0; i < want.size(); ++i)
    for (const auto& [k, v] : want[i].items()) {
      ASSERT_TRUE(got[i].contains(k)) << what << " #" << i << ": no '" << k << "' in " << got[i].dump();
      const Json& g = got[i][k];
      if (v.is_number() && g.is_number()) {
        EXPECT_TRUE(close(g.get<double>(), v.get<double>()))
            << what << " #" << i << " (" << want[i].value("id", Json()) << ") " << k << ": " << g << " vs "
            << v;
      } else {
        EXPECT_EQ(g, v) << what << " #" << i << " (" << want[i].value("id", Json()) << ") " << k;
      }
    }
}

}  // namespace gmod::eval::test_fixture

// The cold start's modality lengths (data/record_lengths.h): the simdjson fast path equals parse_record's lengths on
// every kind of record, decides the plain ones itself and hands the doubtful ones to parse_record; the file-level
// scan (blocks, workers, JSON list and JSONL) equals parsing each record.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "data/record_lengths.h"
#include "data/records.h"
#include "tests/common/paths.h"

using namespace gmod;

namespace {

struct Case {
  const char* json;
  bool fast;  // the fast path decides it (otherwise parse_record must)
};

// Each record's length from both paths, in the same run: the fast one must equal parse_record's whenever it answers.
const Case kCases[] = {
    {R"({"id": "a", "image": "x.png", "conversations": [{"from": "human", "value": "<image>\nWhat is it?"},
        {"from": "gpt", "value": "A  cat\tsits.\r\n"}]})", true},
    {R"({"id": 7, "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": ""}]})", true},
    {R"({"conversations": [{"from": "human", "value": ""}]})", true},  // 0 words, text-only: -1 by LLaVA's max(…, 1)
    {R"({"id": null, "image": null, "conversations": [{"value": "a b", "from": "gpt"}]})", true},
    // Keys beyond LLaVA's: parse_record decides (other layouts and media keys are its business).
    {R"({"id": 1, "conversations": [{"value": "a b", "from": "gpt", "extra": [1, {"k": 2}]}]})", false},
    {R"({"id": 2, "model": "x", "conversations": [{"value": "a b", "from": "gpt"}]})", false},
    {R"({"id": 18446744073709551615, "image": ["a.png", "b.png"], "conversations": [{"from": "human", "value": "x"}]})",
     true},
    {R"({"id": -5, "image": [], "conversations": [{"from": "human", "value": "empty list: text-only"}]})", true},
    {R"({"id": "e", "conversations": [{"from": "human", "value": "esc\u0041ped\nwords\u00e9 \\n \" q"}]})", true},
    {R"({"id": "u", "conversations": [{"from": "human", "value": "caf\u00e9 na\u00efve \u2003 wide"}]})", true},
    {R"({"id": "raw", "conversations": [{"from": "human", "value": "naïve ° 漢字 words"}]})", true},
    // Bad records: parse_record says -1; the fast path leaves them to it.
    {R"({"id": "r", "conversations": [{"from": "system", "value": "x"}]})", false},
    {R"({"id": "m", "conversations": []})", false},
    {R"({"id": "n"})", false},
    {R"({"id": 1.5, "conversations": [{"from": "human", "value": "x"}]})", false},
    {R"({"id": -0, "conversations": [{"from": "human", "value": "x"}]})", true},  // an integer in both parsers
    {R"({"id": true, "conversations": [{"from": "human", "value": "x"}]})", false},
    {R"({"image": "", "conversations": [{"from": "human", "value": "x"}]})", false},
    {R"({"image": ["a.png", 3], "conversations": [{"from": "human", "value": "x"}]})", false},
    {R"({"image": 3, "conversations": [{"from": "human", "value": "x"}]})", false},
    {R"({"conversations": {"from": "human", "value": "x"}})", false},
    {R"({"conversations": ["x"]})", false},
    {R"({"conversations": [{"from": "human"}]})", false},
    {R"({"conversations": [{"from": "human", "value": 3}]})", false},
    {R"({"conversations": [{"from": "human", "value": "x",}]})", false},  // trailing comma
    {R"({"conversations": [{"from": "human", "value": "x"}])", false},    // unbalanced
    {R"([{"conversations": [{"from": "human", "value": "x"}]}])", false},
    {"{\"conversations\": [{\"from\": \"human\", \"value\": \"bad \xff utf8\"}]}", false},
    {"{\"conversations\": [{\"from\": \"human\", \"value\": \"raw\ttab\"}]}", false},  // control character
    {R"({"conversations": [{"from": "human", "value": "big"}], "n": 123456789012345678901234567890})", false},
    // Valid, but decided by parse_record: repeated keys (the last one counts there), surrogate escapes.
    {R"({"image": "a.png", "image": null, "conversations": [{"from": "human", "value": "x"}]})", false},
    {R"({"conversations": [{"from": "human", "value": "x"}], "conversations": [{"from": "gpt", "value": "y z"}]})",
     false},
    {R"({"conversations": [{"from": "human", "from": "gpt", "value": "x"}]})", false},
    {R"({"conversations": [{"from": "human", "value": "x", "value": "y z"}]})", false},
    {R"({"id": "s", "conversations": [{"from": "human", "value": "pair \ud83d\ude00 ok"}]})", false},
    {R"({"id": "s", "conversations": [{"from": "human", "value": "lone \udc00"}]})", false},
    {R"({"id": "s", "conversations": [{"from": "human", "value": "lone \ud800 x"}]})", false},
};

}  // namespace

TEST(RecordLengths, FastPathEqualsParseRecordOrDefersToIt) {
  int i = 0;
  for (const Case& c : kCases) {
    SCOPED_TRACE("case " + std::to_string(i++) + ": " + c.json);
    const int64_t ref = modality_length_parsed(c.json, "case");
    int64_t fast = 12345;
    const bool decided = modality_length_fast(c.json, fast);
    EXPECT_EQ(decided, c.fast);
    if (decided) {
      EXPECT_EQ(fast, ref);
    }
  }
  // The reference itself on two of them (LLaVA's rule: words + 128 with an image, -max(words, 1) without).
  EXPECT_EQ(modality_length_parsed(kCases[0].json, "case"), 4 + 3 + 128);
  EXPECT_EQ(modality_length_parsed(kCases[2].json, "case"), -1);
  EXPECT_EQ(modality_length_parsed(R"({"conversations": [{"from": "system", "value": "x"}]})", "case"), -1);
}

// A file of random records, good and bad, with records larger than a read block: the scan over workers and blocks
// (words counted 16 bytes at a time) equals parse_record with words counted a character at a time, record by
// record, for the JSON list and the JSONL layout, and only the doubtful records take parse_record.
TEST(RecordLengths, FileScanEqualsParsingEveryRecord) {
  gmod::test::TempDir dir;
  std::mt19937 rng(47);
  std::vector<std::string> recs;
  size_t doubtful = 0;
  for (int i = 0; i < 9000; ++i) {
    std::string v;
    const int words = int(rng() % 40);
    static const char* const kSeps[] = {" ", "\\n", "\\t", "  ", "\\r\\n", " \\t ", "\\u0020"};
    for (int w = 0; w < words; ++w) v += kSeps[rng() % 7] + std::string(1 + rng() % 20, 'a' + char(rng() % 26));
    if (rng() % 2) v += kSeps[rng() % 7];  // trailing whitespace
    if (i == 4500) v += std::string(9u << 20, 'z');  // one record larger than a read block (8 MiB)
    std::string r = R"({"id": )" + std::to_string(i) + (rng() % 3 ? R"(, "image": "i.png")" : "") +
                    R"(, "conversations": [{"from": "human", "value": ")" + v + R"("}, {"from": ")" +
                    (i % 97 == 0 ? "system" : "gpt") + R"(", "value": "ok"}]})";
    if (i % 101 == 0) r = R"({"id": "dup", "conversations": [], "conversations": [{"from": "gpt", "value": "a b"}]})";
    doubtful += i % 97 == 0 || i % 101 == 0;
    recs.push_back(r);
  }
  for (const bool jsonl : {false, true}) {
    SCOPED_TRACE(jsonl ? "jsonl" : "json list");
    const std::string path = dir.str(jsonl ? "r.jsonl" : "r.json");
    {
      std::ofstream f(path);
      if (!jsonl) f << "[\n";
      for (size_t i = 0; i < recs.size(); ++i) f << recs[i] << (jsonl ? "\n" : i + 1 < recs.size() ? ",\n" : "\n");
      if (!jsonl) f << "]\n";
    }
    RecordFile rf(path, /*use_cache=*/false);
    ASSERT_EQ(rf.size(), recs.size());
    std::vector<int64_t> ref;
    for (size_t i = 0; i < rf.size(); ++i) ref.push_back(modality_length_parsed(rf.raw(i), "r"));
    for (unsigned threads : {1u, 2u, 3u}) {
      size_t slow = 0;
      EXPECT_EQ(compute_record_lengths(rf, 0, rf.size(), threads, &slow), ref) << threads << " threads";
      EXPECT_EQ(slow, doubtful);
    }
    // A sub-range, as trainer/shared_lengths.h splits the records over ranks.
    const std::vector<int64_t> part = compute_record_lengths(rf, 4000, 5000, 2);
    EXPECT_EQ(part, std::vector<int64_t>(ref.begin() + 4000, ref.begin() + 5000));
  }
}

// serve/answer_text.h: an answer built token by token with the SentencePiece fixture tokenizer. The oracle is
// the tokenizer's decode of all the ids at once (cut at the stop string's first occurrence by
// std::string::find); the streamed deltas must add up to it, each a whole UTF-8 text, none holding the start
// of a stop string.
#include <gtest/gtest.h>

#include "data/tokenizer.h"
#include "serve/answer_text.h"
#include "tests/common/paths.h"

namespace gmod::serve {
namespace {

std::shared_ptr<const Tokenizer> sp() {
  return load_tokenizer(test::fixture("tokenizer/sp/tokenizer.model"));
}

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

struct Streamed {
  std::string text;
  std::vector<std::string> deltas;
  Completion c;
};

Streamed stream(const std::vector<int32_t>& ids, std::vector<std::string> stop, int64_t max_tokens,
                int64_t eos) {
  AnswerText a(sp(), std::move(stop), max_tokens, eos);
  Streamed s;
  for (int32_t id : ids) {
    if (a.finished()) break;
    std::string d = a.add(id);
    if (!d.empty()) s.deltas.push_back(d);
    s.text += d;
  }
  s.text += a.end();
  s.c = a.completion(7);
  return s;
}

TEST(AnswerText, DeltasAddUpToTheWholeDecodeAndAreWholeCharacters) {
  auto tok = sp();
  // Non-ASCII text: characters outside the fixture's vocabulary go through byte-fallback pieces.
  const std::vector<int32_t> ids = tok->encode("Hello wörld, ✓ naïve café 日本 done");
  const Streamed s = stream(ids, {}, int64_t(ids.size()), -1);
  EXPECT_EQ(s.text, tok->decode(ids));
  EXPECT_GT(s.deltas.size(), 3u);
  for (const auto& d : s.deltas) EXPECT_TRUE(valid_utf8(d)) << d;
  EXPECT_EQ(s.c.text, s.text);
  EXPECT_EQ(s.c.finish_reason, "length");
  EXPECT_EQ(s.c.completion_tokens, int64_t(ids.size()));
  EXPECT_EQ(s.c.prompt_tokens, 7);
}

TEST(AnswerText, StopStringCutsAndIsNeverStreamed) {
  auto tok = sp();
  const std::vector<int32_t> ids = tok->encode("one two three STOP four five");
  const std::string whole = tok->decode(ids);
  const std::string want = whole.substr(0, whole.find("STOP"));
  const Streamed s = stream(ids, {"STOP", "zzz"}, 100, -1);
  EXPECT_EQ(s.text, want);
  EXPECT_EQ(s.c.text, want);
  EXPECT_EQ(s.c.finish_reason, "stop");
  EXPECT_LT(s.c.completion_tokens, int64_t(ids.size()));  // ended at the stop string, not at the last token
  for (const auto& d : s.deltas)
    EXPECT_EQ(d.find('S'), std::string::npos) << "a stop string's start streamed";
}

TEST(AnswerText, EosEndsWithStopAndCountsTheEos) {
  auto tok = sp();
  const std::vector<int32_t> ids = tok->encode("short answer");
  ASSERT_TRUE(tok->eos_id());
  std::vector<int32_t> with_eos = ids;
  with_eos.push_back(*tok->eos_id());
  with_eos.push_back(ids[0]);  // after EOS: ignored
  const Streamed s = stream(with_eos, {}, 100, *tok->eos_id());
  EXPECT_EQ(s.text, tok->decode(ids));
  EXPECT_EQ(s.c.finish_reason, "stop");
  EXPECT_EQ(s.c.completion_tokens, int64_t(ids.size()) + 1);
}

TEST(AnswerText, MaxTokensEndsWithLength) {
  auto tok = sp();
  const std::vector<int32_t> ids = tok->encode("a b c d e f g h");
  const Streamed s = stream(ids, {}, 3, -1);
  EXPECT_EQ(s.text, tok->decode({ids[0], ids[1], ids[2]}));
  EXPECT_EQ(s.c.finish_reason, "length");
  EXPECT_EQ(s.c.completion_tokens, 3);
}

}  // namespace
}  // namespace gmod::serve

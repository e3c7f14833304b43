// serve/prompt_bound.h: the chunked token count is a lower bound of the whole text's (checked against the full
// count on SentencePiece and byte-level BPE tokenizers, on prose, runs of spaces, long words and text without any
// whitespace), equal to it when the text is one chunk, and it stops reading once the limit is passed.
#include "serve/prompt_bound.h"

#include "tests/common/paths.h"

#include <gtest/gtest.h>

#include <random>

namespace {

using gmod::serve::token_lower_bound;

std::string mixed_text(uint32_t seed, size_t n) {
  std::mt19937 g(seed);
  const std::vector<std::string> parts = {"the", " ", "  ", "image", "\n", "tokens", "é", "猫", "🙂", ",",
                                          "supercalifragilistic", "\t", "42", "<image>", "a"};
  std::string s;
  while (s.size() < n) s += parts[g() % parts.size()];
  return s;
}

TEST(PromptBound, IsALowerBoundOfTheFullCountOnEveryTokenizer) {
  for (const char* dir : {"sp/tokenizer.model", "llama3", "gpt2"}) {
    const auto tok = gmod::load_tokenizer(gmod::test::fixture(std::string("tokenizer/") + dir));
    for (uint32_t seed = 0; seed < 6; ++seed) {
      std::string text = mixed_text(seed, 3000);
      if (seed == 5) text = std::string(3000, 'x');  // no whitespace at all: forced cuts
      const int64_t full = int64_t(tok->encode(text, /*parse_special=*/false).size());
      for (size_t chunk : {64, 200, 500}) {  // 4 x 500 < 3000: the run without whitespace is cut too
        const auto b = token_lower_bound(*tok, text, /*limit=*/1 << 30, chunk);
        EXPECT_LE(b.tokens, full) << dir << " seed " << seed << " chunk " << chunk;
        EXPECT_GT(b.cuts, 0) << dir << " chunk " << chunk;
        EXPECT_GE(b.tokens, full - 2 * b.cuts) << dir;  // the allowance is all it gives away
        EXPECT_FALSE(b.over);
        EXPECT_EQ(b.bytes_read, text.size());
      }
      const auto one = token_lower_bound(*tok, text, 1 << 30, 1 << 20);
      EXPECT_EQ(one.cuts, 0);
      EXPECT_EQ(one.tokens, full) << dir << ": one chunk is the exact count";
    }
  }
}

TEST(PromptBound, StopsReadingOncePastTheLimit) {
  const auto tok = gmod::load_tokenizer(gmod::test::fixture("tokenizer/sp/tokenizer.model"));
  const std::string big = mixed_text(7, size_t(4) << 20);  // 4 MiB
  const auto b = token_lower_bound(*tok, big, /*limit=*/2048);
  EXPECT_TRUE(b.over);
  EXPECT_GT(b.tokens, 2048);
  EXPECT_LT(b.bytes_read, size_t(256) << 10) << "read " << b.bytes_read << " bytes for a limit of 2048 tokens";
  const auto small = token_lower_bound(*tok, "hello world", 2048);
  EXPECT_FALSE(small.over);
  EXPECT_EQ(small.tokens, int64_t(tok->encode("hello world", false).size()));
}

}  // namespace

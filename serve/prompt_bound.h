// A cheap refusal of prompts that cannot fit the context, before the prompt is built (which tokenizes all of it):
// a 47 MiB message used to cost 40 s of CPU and 8 GiB of memory for a 400.
// token_lower_bound tokenizes `text` chunk by chunk and stops as soon as the count passes `limit`, so the work is at
// most about `limit` tokens' worth of text plus one chunk however long `text` is. Cuts are made before a whitespace
// byte that follows a non-whitespace one: a word boundary for SentencePiece (split_by_whitespace) and for the
// byte-level BPE pre-tokenizers, which no token spans; such a cut can add at most one token (SentencePiece's dummy
// prefix on the next chunk). A run of more than 4 chunks without whitespace is cut at a UTF-8 character boundary,
// counted as up to two tokens (a re-segmented word). The count minus those allowances is the bound; tests check it
// against the full count (tests/serve/test_prompt_bound.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "data/tokenizer.h"

namespace gmod::serve {

struct TokenBound {
  int64_t tokens = 0;     // lower bound of the text's token count (exact when no cut was made)
  int64_t cuts = 0;       // chunk boundaries made
  size_t bytes_read = 0;  // how much of the text was tokenized
  bool over = false;      // tokens > limit (the rest of the text was not read)
};

TokenBound token_lower_bound(const Tokenizer& tok, const std::string& text, int64_t limit,
                             size_t chunk_bytes = size_t(16) << 10);

}  // namespace gmod::serve

// token_lower_bound: see prompt_bound.h.
#include "serve/prompt_bound.h"

#include <algorithm>

namespace gmod::serve {
namespace {
bool space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool utf8_continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }
}  // namespace

TokenBound token_lower_bound(const Tokenizer& tok, const std::string& text, int64_t limit, size_t chunk_bytes) {
  TokenBound b;
  chunk_bytes = std::max<size_t>(chunk_bytes, 16);
  int64_t counted = 0, allowance = 0;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = std::min(text.size(), at + chunk_bytes);
    const size_t hard = std::min(text.size(), at + 4 * chunk_bytes);
    while (end < hard && !(space(text[end]) && !space(text[end - 1]))) ++end;
    int64_t cost = 1;  // a cut at a word boundary
    if (end < text.size() && !(space(text[end]) && !space(text[end - 1]))) {
      while (end > at + 1 && utf8_continuation(text[end])) --end;  // a whole character on each side
      cost = 2;
    }
    counted += int64_t(tok.encode(text.substr(at, end - at), /*parse_special=*/false).size());
    if (end < text.size()) ++b.cuts, allowance += cost;
    at = end;
    b.bytes_read = at;
    b.tokens = std::max<int64_t>(0, counted - allowance);
    if (b.tokens > limit) break;
  }
  b.over = b.tokens > limit;
  return b;
}

}  // namespace gmod::serve

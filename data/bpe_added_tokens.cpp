// Added-token split of the byte-level BPE tokenizer; see bpe_added_tokens.h.
#include "data/bpe_added_tokens.h"

#include <cctype>

#include "data/pcre2_regex.h"
#include "data/utf8.h"

namespace gmod::bpe {
namespace {

bool is_word_char_before(std::string_view s, size_t end) {  // Rust: last char alphanumeric or '_'
  if (end == 0) return false;
  size_t len;
  const size_t at = utf8::prev(s, end);
  const uint32_t c = utf8::code_point(s, at, &len);
  if (c < 0x80) return std::isalnum(static_cast<int>(c)) || c == '_';
  static const Pcre2Regex word(R"([\p{L}\p{N}\p{Mn}\p{Mc}])", false);
  bool hit = false;
  word.for_each_match(s.substr(at, len), [&](size_t, size_t) { hit = true; });
  return hit;
}
bool is_word_char_after(std::string_view s, size_t start) {
  if (start >= s.size()) return false;
  size_t len;
  utf8::code_point(s, start, &len);
  return is_word_char_before(s, start + len);
}

}  // namespace

void split_added(std::string_view s, size_t base, const AddedMatcher& m, bool parse_special,
                 std::vector<Segment>& out) {
  size_t start_offset = 0, pos = 0, at = 0;
  while (const Added* t = m.find(s, pos, &at)) {
    size_t start = at, stop = at + t->content.size();
    pos = stop;
    if (!parse_special && t->special) continue;
    if (t->single_word && (is_word_char_before(s, start) || is_word_char_after(s, stop))) continue;
    if (t->lstrip) {
      size_t ns = start, len;
      while (ns > 0) {
        const size_t p = utf8::prev(s, ns);
        if (!utf8::is_white_space(utf8::code_point(s, p, &len))) break;
        ns = p;
      }
      start = std::max(ns, start_offset);
    }
    if (t->rstrip) {
      size_t len;
      while (stop < s.size() && utf8::is_white_space(utf8::code_point(s, stop, &len))) stop += len;
      pos = std::max(pos, stop);
    }
    if (start_offset < start) out.push_back({base + start_offset, base + start, -1});
    out.push_back({base + start, base + stop, t->id});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({base + start_offset, base + s.size(), -1});
}

}  // namespace gmod::bpe

// A compiled PCRE2 regular expression (UTF-8, Unicode properties, JIT) with a non-overlapping match iterator.
// The byte-level BPE pre-tokenizers need \p{L}/\p{N} classes and lookahead, which std::regex and RE2 lack.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdexcept>
#include <string>
#include <string_view>

#include "data/utf8.h"

namespace gmod {

class Pcre2Regex {
 public:
  // `literal`: match the pattern as a plain string. Throws std::invalid_argument with PCRE2's message and the
  // offset when the pattern does not compile.
  Pcre2Regex(const std::string& pattern, bool literal);
  ~Pcre2Regex();
  Pcre2Regex(const Pcre2Regex&) = delete;
  Pcre2Regex& operator=(const Pcre2Regex&) = delete;

  // Calls f(start, end) for each non-empty match in `s` (valid UTF-8), left to right, non-overlapping.
  template <class F>
  void for_each_match(std::string_view s, F&& f) const {
    auto& st = thread_state();
    const auto subj = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t pos = 0;
    while (pos <= s.size()) {
      const int rc = pcre2_match(code_, subj, s.size(), pos, PCRE2_NO_UTF_CHECK, st.md, st.ctx);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) throw std::runtime_error("PCRE2 match failed with code " + std::to_string(rc));
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
      if (ov[1] == ov[0]) {  // empty match: step over one character
        if (ov[0] >= s.size()) break;
        size_t len;
        utf8::code_point(s, ov[0], &len);
        pos = ov[0] + len;
        continue;
      }
      f(ov[0], ov[1]);
      pos = ov[1];
    }
  }

 private:
  struct ThreadState {  // per-thread match data and JIT stack, shared by every regex
    pcre2_match_data* md;
    pcre2_jit_stack* stack;
    pcre2_match_context* ctx;
    ThreadState();
    ~ThreadState();
  };
  static ThreadState& thread_state();
  pcre2_code* code_ = nullptr;
};

}  // namespace gmod

#include "data/pcre2_regex.h"

namespace gmod {

Pcre2Regex::ThreadState::ThreadState()
    : md(pcre2_match_data_create(16, nullptr)),
      stack(pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, nullptr)),
      ctx(pcre2_match_context_create(nullptr)) {
  pcre2_jit_stack_assign(ctx, nullptr, stack);
}

Pcre2Regex::ThreadState::~ThreadState() {
  pcre2_match_context_free(ctx);
  pcre2_jit_stack_free(stack);
  pcre2_match_data_free(md);
}

Pcre2Regex::ThreadState& Pcre2Regex::thread_state() {
  thread_local ThreadState st;
  return st;
}

Pcre2Regex::Pcre2Regex(const std::string& pattern, bool literal) {
  int err = 0;
  PCRE2_SIZE off = 0;
  const uint32_t opts = literal ? (PCRE2_UTF | PCRE2_LITERAL) : (PCRE2_UTF | PCRE2_UCP);
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err, &off, nullptr);
  if (!code_) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw std::invalid_argument("regex /" + pattern + "/ does not compile with PCRE2 at offset " +
                                std::to_string(off) + ": " + reinterpret_cast<char*>(msg));
  }
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
}

Pcre2Regex::~Pcre2Regex() { pcre2_code_free(code_); }

}  // namespace gmod

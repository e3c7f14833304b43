// Python `re` operations on PCRE2 (see regex.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "eval/regex.h"

#include <pcre2.h>

#include <stdexcept>

namespace gmod::eval {

struct Regex::Impl {
  pcre2_code* code = nullptr;
  pcre2_match_data* md = nullptr;  // one per Regex: a Regex is used from one thread at a time
  uint32_t groups = 0;
  ~Impl() {
    if (md) pcre2_match_data_free(md);
    if (code) pcre2_code_free(code);
  }
};

namespace {

// Python's \s for str patterns is str.isspace(): general category Zs or bidirectional class WS, B or S (which
// takes in \x1c-\x1f); PCRE2's is Unicode's White_Space (with U+180E in \h). Written with PCRE2's own Unicode
// properties, \s and \S mean Python's. Everything else passes through (an escaped backslash stays escaped).
std::string python_classes(const std::string& p) {
  static const std::string space = R"(\p{Zs}\p{bc=WS}\p{bc=B}\p{bc=S})";
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == '\\' && i + 1 < p.size()) {
      const char c = p[i + 1];
      if (c == 's')
        out += in_class ? space : "[" + space + "]";
      else if (c == 'S' && !in_class)
        out += "[^" + space + "]";
      else
        out += p.substr(i, 2);
      ++i;
      continue;
    }
    if (p[i] == '[' && !in_class)
      in_class = true;
    else if (p[i] == ']' && in_class && !out.empty() && out.back() != '[')
      in_class = false;
    out += p[i];
  }
  return out;
}

}  // namespace

Regex::Regex(const std::string& pattern_in, bool dotall) : impl_(std::make_unique<Impl>()) {
  int err = 0;
  PCRE2_SIZE off = 0;
  const std::string pattern = python_classes(pattern_in);
  pcre2_compile_context* cc = pcre2_compile_context_create(nullptr);
  pcre2_set_newline(cc, PCRE2_NEWLINE_LF);  // '.' excludes only '\n', as in Python
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP | (dotall ? PCRE2_DOTALL : 0u), &err, &off, cc);
  pcre2_compile_context_free(cc);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw std::invalid_argument("regex \"" + pattern_in + "\" does not compile at offset " +
                                std::to_string(off) + ": " + reinterpret_cast<const char*>(msg));
  }
  pcre2_pattern_info(impl_->code, PCRE2_INFO_CAPTURECOUNT, &impl_->groups);
  impl_->md = pcre2_match_data_create_from_pattern(impl_->code, nullptr);
}

Regex::~Regex() = default;

template <class F>
void Regex::each(std::string_view s, F&& f) const {
  const auto subj = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0;
  uint32_t opts = 0;
  while (pos <= s.size()) {
    const int rc = pcre2_match(impl_->code, subj, s.size(), pos, opts, impl_->md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) {
      if (!opts) break;
      // no non-empty match here: step over one code point and search on
      opts = 0;
      if (pos >= s.size()) break;
      ++pos;
      while (pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (rc < 0) throw std::runtime_error("regex match failed with PCRE2 code " + std::to_string(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(impl_->md);
    if (!f(static_cast<size_t>(ov[0]), static_cast<size_t>(ov[1]), ov)) return;
    pos = ov[1];
    // after an empty match, first try a non-empty one at the same place; if none, the NOMATCH branch steps on
    opts = ov[0] == ov[1] ? PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED : 0;
  }
}

bool Regex::search(std::string_view s) const {
  bool found = false;
  each(s, [&](size_t, size_t, const PCRE2_SIZE*) { return !(found = true); });
  return found;
}

std::optional<std::string> Regex::search_group(std::string_view s, int g) const {
  std::optional<std::string> out;
  each(s, [&](size_t, size_t, const PCRE2_SIZE* ov) {
    if (ov[2 * g] != PCRE2_UNSET)
      out = std::string(s.substr(ov[2 * g], ov[2 * g + 1] - ov[2 * g]));
    else
      out = std::string();
    return false;
  });
  return out;
}

std::vector<std::string> Regex::findall(std::string_view s) const {
  std::vector<std::string> out;
  const int g = impl_->groups == 1 ? 1 : 0;
  each(s, [&](size_t, size_t, const PCRE2_SIZE* ov) {
    if (ov[2 * g] == PCRE2_UNSET)
      out.emplace_back();
    else
      out.emplace_back(s.substr(ov[2 * g], ov[2 * g + 1] - ov[2 * g]));
    return true;
  });
  return out;
}

std::string Regex::sub(std::string_view s, std::string_view literal, size_t count) const {
  std::string out;
  size_t last = 0, n = 0;
  each(s, [&](size_t b, size_t e, const PCRE2_SIZE*) {
    out.append(s.substr(last, b - last));
    out.append(literal);
    last = e;
    return count == 0 || ++n < count;
  });
  out.append(s.substr(last));
  return out;
}

std::vector<std::string> Regex::split(std::string_view s) const {
  std::vector<std::string> out;
  size_t last = 0;
  each(s, [&](size_t b, size_t e, const PCRE2_SIZE*) {
    out.emplace_back(s.substr(last, b - last));
    last = e;
    return true;
  });
  out.emplace_back(s.substr(last));
  return out;
}

}  // namespace gmod::eval

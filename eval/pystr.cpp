// Python str semantics on UTF-8 strings (see pystr.h).
#include "eval/pystr.h"

#include <unicode/locid.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace gmod::eval::py {
namespace {

// The code point at byte i of UTF-8 `s` and its byte length (a malformed byte reads as itself, length 1).
uint32_t code_point(std::string_view s, size_t i, size_t* len) {
  const auto b = static_cast<unsigned char>(s[i]);
  auto cont = [&](size_t k) {
    return i + k < s.size() && (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
  };
  if (b < 0x80) return *len = 1, b;
  if ((b & 0xE0) == 0xC0 && cont(1)) return *len = 2, ((b & 0x1Fu) << 6) | (s[i + 1] & 0x3F);
  if ((b & 0xF0) == 0xE0 && cont(1) && cont(2))
    return *len = 3, ((b & 0x0Fu) << 12) | ((s[i + 1] & 0x3Fu) << 6) | (s[i + 2] & 0x3F);
  if ((b & 0xF8) == 0xF0 && cont(1) && cont(2) && cont(3))
    return *len = 4,
           ((b & 0x07u) << 18) | ((s[i + 1] & 0x3Fu) << 12) | ((s[i + 2] & 0x3Fu) << 6) | (s[i + 3] & 0x3F);
  return *len = 1, b;
}

// str.isspace() of one code point, as Python's unicodedata build defines it: general category Zs, or
// bidirectional class WS, B or S (ICU's character database).
bool is_space_cp(uint32_t c) {
  const auto ch = static_cast<UChar32>(c);
  if (u_charType(ch) == U_SPACE_SEPARATOR) return true;
  const UCharDirection d = u_charDirection(ch);
  return d == U_WHITE_SPACE_NEUTRAL || d == U_BLOCK_SEPARATOR || d == U_SEGMENT_SEPARATOR;
}

// str.isalpha() of one code point: general category Lu, Ll, Lt, Lm or Lo.
bool is_alpha_cp(uint32_t c) {
  const int8_t t = u_charType(static_cast<UChar32>(c));
  return t == U_UPPERCASE_LETTER || t == U_LOWERCASE_LETTER || t == U_TITLECASE_LETTER ||
         t == U_MODIFIER_LETTER || t == U_OTHER_LETTER;
}

// Byte offset just after the last non-space code point.
size_t content_end(std::string_view s) {
  size_t end = 0, i = 0, len = 0;
  while (i < s.size()) {
    if (!is_space_cp(code_point(s, i, &len))) end = i + len;
    i += len;
  }
  return end;
}

size_t content_begin(std::string_view s) {
  size_t i = 0, len = 0;
  while (i < s.size() && is_space_cp(code_point(s, i, &len))) i += len;
  return i;
}

}  // namespace

bool is_space_at(std::string_view s, size_t i, size_t* len) { return is_space_cp(code_point(s, i, len)); }

bool is_alpha_at(std::string_view s, size_t i, size_t* len) { return is_alpha_cp(code_point(s, i, len)); }

bool isalpha(std::string_view s) {
  if (s.empty()) return false;
  size_t len = 0;
  for (size_t i = 0; i < s.size(); i += len)
    if (!is_alpha_at(s, i, &len)) return false;
  return true;
}

std::string strip(std::string_view s) {
  const size_t b = content_begin(s);
  const size_t e = content_end(s);
  return b < e ? std::string(s.substr(b, e - b)) : std::string();
}

std::string rstrip(std::string_view s) { return std::string(s.substr(0, content_end(s))); }

std::string strip_chars(std::string_view s, std::string_view chars) {
  const size_t b = s.find_first_not_of(chars);
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(chars);
  return std::string(s.substr(b, e - b + 1));
}

std::string rstrip_chars(std::string_view s, std::string_view chars) {
  const size_t e = s.find_last_not_of(chars);
  return e == std::string_view::npos ? std::string() : std::string(s.substr(0, e + 1));
}

std::vector<std::string> split_ws(std::string_view s) {
  std::vector<std::string> out;
  size_t i = 0, len = 0, start = std::string_view::npos;
  while (i < s.size()) {
    const bool space = is_space_cp(code_point(s, i, &len));
    if (space && start != std::string_view::npos)
      out.emplace_back(s.substr(start, i - start)), start = std::string_view::npos;
    if (!space && start == std::string_view::npos) start = i;
    i += len;
  }
  if (start != std::string_view::npos) out.emplace_back(s.substr(start));
  return out;
}

std::vector<std::string> split(std::string_view s, std::string_view sep) {
  std::vector<std::string> out;
  size_t from = 0;
  for (size_t at; (at = s.find(sep, from)) != std::string_view::npos; from = at + sep.size())
    out.emplace_back(s.substr(from, at - from));
  out.emplace_back(s.substr(from));
  return out;
}

std::string lower(std::string_view s) {
  bool ascii = true;
  for (char c : s) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) {
    std::string out(s);
    for (char& c : out)
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    return out;
  }
  // full case mapping with the root locale: SpecialCasing's unconditional entries (U+0130 -> i + U+0307)
  // and Final_Sigma, as str.lower() applies them
  icu::UnicodeString u =
      icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
  std::string out;
  u.toLower(icu::Locale::getRoot()).toUTF8String(out);
  return out;
}

std::string replace(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  size_t pos = 0;
  for (size_t at; (at = s.find(from, pos)) != std::string_view::npos; pos = at + from.size()) {
    out.append(s.substr(pos, at - pos));
    out.append(to);
  }
  out.append(s.substr(pos));
  return out;
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out.append(sep);
    out.append(parts[i]);
  }
  return out;
}

size_t length(std::string_view s) {
  size_t n = 0, i = 0, len = 0;
  while (i < s.size()) code_point(s, i, &len), i += len, ++n;
  return n;
}

bool parse_float(std::string_view s_in, double* out) {
  // as float() on a str: Unicode whitespace becomes ' ', a Unicode decimal digit its ASCII digit, any other
  // non-ASCII character makes it invalid (_PyUnicode_TransformDecimalAndSpaceToASCII)
  std::string s;
  size_t len = 0;
  for (size_t i = 0; i < s_in.size(); i += len) {
    const uint32_t c = code_point(s_in, i, &len);
    if (c < 127) {
      s += static_cast<char>(c);
    } else if (is_space_cp(c)) {
      s += ' ';
    } else if (const int32_t d = u_charDigitValue(static_cast<UChar32>(c));
               d >= 0 && u_charType(static_cast<UChar32>(c)) == U_DECIMAL_DIGIT_NUMBER) {
      s += static_cast<char>('0' + d);
    } else {
      return false;
    }
  }
  const std::string t = strip(s);
  std::string clean;  // the number without its underscores, for strtod
  size_t i = 0;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) clean += t[i++];
  const std::string rest = lower(t.substr(i));
  if (rest == "inf" || rest == "infinity" || rest == "nan") {
    *out = std::strtod((clean + rest).c_str(), nullptr);
    return true;
  }
  // digits with single underscores between digits; returns the count of digits read
  auto digits = [&](void) {
    size_t n = 0;
    while (i < t.size()) {
      if (t[i] >= '0' && t[i] <= '9') {
        clean += t[i++], ++n;
      } else if (t[i] == '_' && n > 0 && i + 1 < t.size() && t[i + 1] >= '0' && t[i + 1] <= '9') {
        ++i;
      } else {
        break;
      }
    }
    return n;
  };
  size_t n = digits();
  if (i < t.size() && t[i] == '.') {
    clean += t[i++];
    n += digits();
  }
  if (n == 0) return false;
  if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    clean += t[i++];
    if (i < t.size() && (t[i] == '+' || t[i] == '-')) clean += t[i++];
    if (digits() == 0) return false;
  }
  if (i != t.size()) return false;
  *out = std::strtod(clean.c_str(), nullptr);
  return true;
}

double round_to(double x, int digits) {
  if (!std::isfinite(x)) return x;
  // glibc's printf rounds the exact binary value to the nearest (ties to even), as Python's dtoa does.
  const int n = std::snprintf(nullptr, 0, "%.*f", digits, x);
  std::string buf(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(buf.data(), buf.size(), "%.*f", digits, x);
  return std::strtod(buf.c_str(), nullptr);
}

double round2(double x) { return round_to(x, 2); }

}  // namespace gmod::eval::py

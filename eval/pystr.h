// Python str semantics the official scoring scripts rely on, on UTF-8 std::strings: str.strip()/split() with
// Python's whitespace, strip(chars), lower() (Unicode full case mapping), isalpha(), replace, float()
// (Unicode digits and spaces), and the length in code points. The character classes and case mappings come
// from ICU (libicu-dev), defined as CPython's unicodedata build defines them; ICU's Unicode version may be
// newer than the Python's (docs/eval.md). The scorers are written against these so that "strip" means what
// the Python original means.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace gmod::eval::py {

// str.strip() / lstrip() / rstrip() with no argument: Python's whitespace (str.isspace, including \x1c-\x1f,
// \x85, \xa0 and the Unicode spaces).
std::string strip(std::string_view s);
std::string rstrip(std::string_view s);
// str.strip(chars) / rstrip(chars) with ASCII `chars`.
std::string strip_chars(std::string_view s, std::string_view chars);
std::string rstrip_chars(std::string_view s, std::string_view chars);
// str.split() with no argument: runs of whitespace separate, no empty words.
std::vector<std::string> split_ws(std::string_view s);
// str.split(sep) with a non-empty separator: every occurrence separates, empty pieces kept.
std::vector<std::string> split(std::string_view s, std::string_view sep);
// str.lower(): every code point's full lower-case mapping (U+0130 -> "i\u0307", final sigma in context).
std::string lower(std::string_view s);
// str.isalpha() (non-empty, every code point a letter: Lu, Ll, Lt, Lm, Lo).
bool isalpha(std::string_view s);
// Whether the code point starting at byte `i` is a letter (str.isalpha); `len` gets its byte length.
bool is_alpha_at(std::string_view s, size_t i, size_t* len);
// str.replace(from, to) (every occurrence, left to right, non-overlapping); `from` non-empty.
std::string replace(std::string_view s, std::string_view from, std::string_view to);
// str.join.
std::string join(const std::vector<std::string>& parts, std::string_view sep);
// len(str): code points of valid UTF-8.
size_t length(std::string_view s);
// Whether the code point starting at byte `i` is Python whitespace; `len` gets its byte length.
bool is_space_at(std::string_view s, size_t i, size_t* len);
// float(s) succeeds (Python's float syntax: surrounding whitespace, sign, digits with single underscores
// between them, a fraction, an exponent, inf/infinity/nan in any case; any Unicode decimal digit counts as
// its digit, any Unicode space as a space); the value goes to `out`.
bool parse_float(std::string_view s, double* out);
// round(x, 2) as Python does it for floats (correctly rounded through the decimal representation).
double round2(double x);
// round(x, digits) for 0 <= digits <= 17.
double round_to(double x, int digits);

}  // namespace gmod::eval::py

// Python `re` operations the scoring scripts use (search, findall, sub with a count, split), on PCRE2 with
// UTF-8 and Unicode properties so \d, \w, \b mean what they mean for Python str patterns, and \s, \S
// rewritten to Python's whitespace (category Zs or bidirectional class WS, B, S). Patterns are compiled once;
// a pattern that does not compile throws std::invalid_argument.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gmod::eval {

class Regex {
 public:
  // `dotall`: '.' matches '\n' too (re.DOTALL).
  explicit Regex(const std::string& pattern, bool dotall = false);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // re.search(p, s) is not None.
  bool search(std::string_view s) const;
  // re.search(p, s).group(g), or nothing without a match.
  std::optional<std::string> search_group(std::string_view s, int g) const;
  // re.findall(p, s): group 1 when the pattern has one group, else the whole match.
  std::vector<std::string> findall(std::string_view s) const;
  // re.sub(p, literal, s, count) (count 0: every match).
  std::string sub(std::string_view s, std::string_view literal, size_t count = 0) const;
  // re.split(p, s) for a pattern without groups.
  std::vector<std::string> split(std::string_view s) const;

 private:
  // Calls f(start, end) per non-overlapping match left to right (Python's empty-match stepping); stops when f
  // returns false.
  template <class F>
  void each(std::string_view s, F&& f) const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gmod::eval

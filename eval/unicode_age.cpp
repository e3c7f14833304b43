// Characters newer than the originals' Python (see unicode_age.h).
#include "eval/unicode_age.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace gmod::eval {
namespace {

// Unicode 13.0: Python 3.10's unicodedata.unidata_version.
constexpr uint8_t kPythonUnicode[2] = {13, 0};

bool newer_and_meaningful(UChar32 c) {
  UVersionInfo age;
  u_charAge(c, age);
  if (age[0] < kPythonUnicode[0] || (age[0] == kPythonUnicode[0] && age[1] <= kPythonUnicode[1]))
    return false;
  return u_isalpha(c) || u_isdigit(c) || u_isUWhiteSpace(c) || u_tolower(c) != c ||
         u_hasBinaryProperty(c, UCHAR_CASED);
}

void scan_file(const std::string& path, std::vector<Problem>* problems) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return;  // the scorer names unreadable files
  const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  int64_t count = 0, line = 1;
  std::string examples;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b == '\n') ++line;
    if (b < 0x80) {
      ++i;
      continue;
    }
    const size_t n = (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 1;
    if (n == 1 || i + n > s.size()) {
      ++i;
      continue;
    }
    UChar32 c = b & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    if (newer_and_meaningful(c)) {
      if (++count <= 3) {
        char buf[48];
        std::snprintf(buf, sizeof buf, "%sU+%04X at line %lld", examples.empty() ? "" : ", ",
                      static_cast<unsigned>(c), static_cast<long long>(line));
        examples += buf;
      }
    }
    i += n;
  }
  if (count)
    problems->push_back(
        {path, std::to_string(count) + " character(s) assigned after Unicode 13.0 (" + examples +
                   "): Python 3.10, which γ-MoD's scripts ran on, has no case or class for them, "
                   "ICU here has; figures that read them may differ from the original's"});
}

}  // namespace

void report_newer_unicode(const std::string& path, std::vector<Problem>* problems) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return scan_file(path, problems);
  std::vector<std::string> files;
  for (auto it = fs::recursive_directory_iterator(path, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const std::string ext = it->path().extension().string();
    if (it->is_regular_file(ec) && (ext == ".json" || ext == ".jsonl" || ext == ".txt" || ext == ".tsv"))
      files.push_back(it->path().string());
  }
  std::sort(files.begin(), files.end());
  for (const std::string& f : files) scan_file(f, problems);
}

}  // namespace gmod::eval

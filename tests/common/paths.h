// Where tests find committed fixtures: $GMOD_SOURCE_DIR (set by ctest) or the source tree of this file.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace gmod::test {

inline std::string source_dir() {
  if (const char* s = std::getenv("GMOD_SOURCE_DIR")) return s;
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path().string();
}

inline std::string fixture(const std::string& rel) { return source_dir() + "/tests/fixtures/" + rel; }

// A fresh temporary directory, removed when the object dies.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "gmod-test-XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string str(const std::string& rel = "") const { return rel.empty() ? path.string() : (path / rel).string(); }
};

}  // namespace gmod::test

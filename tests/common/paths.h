// Where tests find committed fixtures: $GMOD_SOURCE_DIR (set by ctest) or the source tree of this file.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <ftw.h>
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
  // nftw, not std::filesystem::remove_all: the torch wheel's libtorch.so exports its own (crashing)
  // copy of the std::filesystem symbols, see docs/engineering.md.
  ~TempDir() {
    nftw(path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
         FTW_DEPTH | FTW_PHYS);
  }
  std::string str(const std::string& rel = "") const { return rel.empty() ? path.string() : (path / rel).string(); }
};

}  // namespace gmod::test

// `--help` / `-h` for the benchmark programs: prints the program's usage (what it measures and its options,
// the same lines as its header comment) to stdout, so that `bench_X --help` answers instead of starting a run
// or failing on an unknown option. Header-only: each bench is one .cpp.
#pragma once

#include <cstdio>
#include <cstring>

namespace gmod {

// True (after printing `usage`) when argv holds --help or -h; the caller then returns 0.
inline bool bench_help(int argc, char** argv, const char* usage) {
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::fputs(usage, stdout);
      return true;
    }
  return false;
}

}  // namespace gmod

// Runs a shell command line for a test and captures what it printed (stdout and stderr), its exit code and how
// long it took: the tests that start mpirun jobs and check how they end (tests/parallel/test_abort.cpp,
// test_watchdog.cpp).
#pragma once

#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <string>

namespace gmod::test {

struct CommandResult {
  int code = -1;  // exit code; -1 when killed by a signal or not started
  std::string out;
  double seconds = 0;
};

inline CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  const auto t0 = std::chrono::steady_clock::now();
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  if (!f) return r;
  std::array<char, 512> buf;
  while (fgets(buf.data(), buf.size(), f)) r.out += buf.data();
  const int st = pclose(f);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace gmod::test

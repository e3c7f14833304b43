// gmod: the command-line entry point. `gmod <command> [args]`; `gmod help` lists the commands.
#include <algorithm>
#include <cstring>
#include <iostream>

#include "launch/args.h"

int main(int argc, char** argv) {
  using gmod::cli::commands;
  auto& cmds = commands();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return std::strcmp(a.name, b.name) < 0; });
  if (argc < 2 || !std::strcmp(argv[1], "help") || !std::strcmp(argv[1], "--help")) {
    std::cout << "usage: gmod <command> [options]\n\ncommands:\n";
    for (auto& c : cmds) std::cout << "  " << c.name << std::string(12 - std::min<size_t>(11, strlen(c.name)), ' ') << c.summary << "\n";
    return argc < 2 ? 2 : 0;
  }
  for (auto& c : cmds) {
    if (std::strcmp(c.name, argv[1]) != 0) continue;
    std::vector<std::string> args(argv + 2, argv + argc);
    try {
      return c.run(args);
    } catch (const std::exception& e) {
      std::cerr << "gmod " << c.name << ": error: " << e.what() << "\n";
      return 1;
    }
  }
  std::cerr << "gmod: unknown command '" << argv[1] << "' (see gmod help)\n";
  return 2;
}

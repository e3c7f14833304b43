// gmod: the command-line entry point. `gmod <command> [options]`; `gmod help` (or --help) lists the commands,
// `gmod <command> --help` (or `gmod help <command>`) its options, `gmod --version` the version.
#include <algorithm>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "launch/args.h"
#include "model/fp32_precision.h"

namespace {

const char* kRunHelp = "Run 'gmod <command> --help' for a command's options (type, default, meaning).\n";
const char* kExitCodes =
    "Exit codes: 0 success; 1 error while working (a file, model or dataset problem; gmod data check: "
    "records\n"
    "with problems); 2 usage error (unknown command or option, missing or bad value); 3 gmod plan: does not "
    "fit.";

// Every (nested) subcommand's --help ends with the exit codes.
void add_exit_codes(CLI::App* app) {
  app->footer(app->get_footer().empty() ? std::string(kExitCodes) : app->get_footer() + "\n" + kExitCodes);
  for (CLI::App* sub : app->get_subcommands({})) add_exit_codes(sub);
}

// "unknown option --modle; unexpected argument x" from the words CLI11 could not place (in command-line
// order).
std::string describe_extras(const std::vector<std::string>& extras, const std::string& fallback) {
  std::string options, words;
  for (const auto& x : extras) {
    std::string& to = x.size() > 1 && x[0] == '-' ? options : words;
    to += (to.empty() ? "" : ", ") + x;
  }
  if (options.empty() && words.empty()) return fallback;
  std::string msg;
  if (!options.empty())
    msg = (options.find(',') == std::string::npos ? "unknown option " : "unknown options ") + options;
  if (!words.empty())
    msg +=
        (msg.empty() ? "" : "; ") +
        std::string(words.find(',') == std::string::npos ? "unexpected argument " : "unexpected arguments ") +
        words;
  return msg;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gmod::cli;
  auto& cmds = commands();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return std::strcmp(a.name, b.name) < 0; });
  gmod::use_ieee_fp32();  // fp32 means IEEE fp32 on the GPU too (model/fp32_precision.h)

  CLI::App app("gmod: instruction tuning of LLaVA-style multimodal LLMs with data parallelism and γ-MoD.",
               "gmod");
  app.get_formatter()->column_width(36);
  app.set_version_flag("--version", version_string(), "print the version (gmod and LibTorch) and exit");
  app.require_subcommand(0, 1);
  std::map<std::string, Runner> runners;
  std::map<std::string, CLI::App*> subs;
  for (const auto& c : cmds) {
    CLI::App* sub = app.add_subcommand(c.name, c.summary);
    sub->formatter(app.get_formatter());
    runners[c.name] = c.setup(*sub);
    subs[c.name] = sub;
    add_exit_codes(sub);
  }
  app.footer(std::string(kRunHelp) + kExitCodes);

  const std::string first = argc > 1 ? argv[1] : "";
  if (argc < 2 || first == "help") {  // `gmod help [command]`
    if (argc > 2 && subs.count(argv[2])) {
      std::cout << subs[argv[2]]->help("gmod");
      return kExitOk;
    }
    if (argc > 2) {
      std::cerr << "gmod help: unknown command '" << argv[2] << "'\n";
      return kExitUsage;
    }
    (argc < 2 ? std::cerr : std::cout) << app.help();
    return argc < 2 ? kExitUsage : kExitOk;
  }
  if (!first.empty() && first[0] != '-' && !subs.count(first)) {
    std::cerr << "gmod: unknown command '" << first << "' (see gmod help)\n";
    return kExitUsage;
  }
  std::string who = subs.count(first) ? "gmod " + first : "gmod";  // the command that errors name
  if (subs.count(first) && argc > 2)
    for (CLI::App* nested : subs[first]->get_subcommands({}))
      if (nested->get_name() == argv[2]) who += " " + nested->get_name();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ExtrasError& e) {
    std::cerr << who << ": error: " << describe_extras(app.remaining(/*recurse=*/true), e.what())
              << "\n(see '" << who << " --help')\n";
    return kExitUsage;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::cerr << who << ": error: " << e.what() << "\n(see '" << who << " --help')\n";
    return kExitUsage;
  }
  if (app.get_subcommands().empty()) {
    std::cerr << "gmod: no command given (see gmod help)\n";
    return kExitUsage;
  }
  try {
    return runners.at(app.get_subcommands().front()->get_name())();
  } catch (const UsageError& e) {
    std::cerr << who << ": error: " << e.what() << "\n(see '" << who << " --help')\n";
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << who << ": error: " << e.what() << "\n";
    return kExitRuntime;
  }
}

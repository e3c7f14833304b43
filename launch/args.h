// Minimal command-line parsing shared by the subcommands: positionals, `--key value`, `--key=value`,
// repeated keys and boolean flags. Unknown options are reported by the command that reads them.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace gmod::cli {

class Args {
 public:
  // `flags` are options that take no value.
  Args(const std::vector<std::string>& argv, const std::set<std::string>& flags = {});
  const std::vector<std::string>& positional() const { return positional_; }
  bool flag(const std::string& name) const;
  std::optional<std::string> get(const std::string& name) const;
  std::string get_or(const std::string& name, const std::string& dflt) const;
  std::vector<std::string> all(const std::string& name) const;  // every value of a repeated option
  // Throws listing options the command did not expect.
  void check_known(const std::set<std::string>& known) const;

 private:
  std::vector<std::string> positional_;
  std::multimap<std::string, std::string> values_;
  std::set<std::string> flags_set_;
};

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>& args);
};

// Registry filled by the cmd_*.cpp files through static registration.
std::vector<Command>& commands();
struct Register {
  Register(Command c) { commands().push_back(c); }
};

}  // namespace gmod::cli

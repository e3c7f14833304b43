#include "launch/args.h"

#include <sstream>

namespace gmod::cli {

Args::Args(const std::vector<std::string>& argv, const std::set<std::string>& flags) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const auto& a = argv[i];
    if (a.rfind("--", 0) != 0 || a == "--") {
      positional_.push_back(a);
      continue;
    }
    auto eq = a.find('=');
    std::string key = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (eq != std::string::npos) {
      values_.emplace(key, a.substr(eq + 1));
    } else if (flags.count(key)) {
      flags_set_.insert(key);
    } else {
      if (i + 1 >= argv.size()) throw std::invalid_argument("option --" + key + " needs a value");
      values_.emplace(key, argv[++i]);
    }
  }
}

bool Args::flag(const std::string& name) const { return flags_set_.count(name) != 0; }

std::optional<std::string> Args::get(const std::string& name) const {
  auto r = values_.equal_range(name);
  if (r.first == r.second) return std::nullopt;
  return std::prev(r.second)->second;  // the last one wins
}

std::string Args::get_or(const std::string& name, const std::string& dflt) const {
  auto v = get(name);
  return v ? *v : dflt;
}

std::vector<std::string> Args::all(const std::string& name) const {
  std::vector<std::string> out;
  auto r = values_.equal_range(name);
  for (auto it = r.first; it != r.second; ++it) out.push_back(it->second);
  return out;
}

void Args::check_known(const std::set<std::string>& known) const {
  std::ostringstream os;
  int n = 0;
  for (auto& [k, v] : values_)
    if (!known.count(k)) os << (n++ ? ", " : "") << "--" << k;
  for (auto& k : flags_set_)
    if (!known.count(k)) os << (n++ ? ", " : "") << "--" << k;
  if (n) throw std::invalid_argument("unknown option" + std::string(n > 1 ? "s: " : ": ") + os.str());
}

std::vector<Command>& commands() {
  static std::vector<Command> c;
  return c;
}

}  // namespace gmod::cli

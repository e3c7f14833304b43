// The helpers shared by the checkpoint writer, manager and reader (checkpoint_files.h).
#include "trainer/checkpoint/checkpoint_files.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace gmod {

using json = nlohmann::json;

namespace checkpoint_files {

json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("checkpoint: cannot open " + path);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw std::runtime_error("checkpoint: " + path + " is not valid JSON: " + e.what());
  }
}

std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof(b), "%08x", v);
  return b;
}

// Parses "step-<digits>" exactly; -1 otherwise.
int64_t parse_step_dir(const std::string& name) {
  const std::string prefix = "step-";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return -1;
  std::string digits = name.substr(prefix.size());
  if (digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return std::stoll(digits);
}

}  // namespace checkpoint_files

}  // namespace gmod

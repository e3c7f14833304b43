// The JSON reader shared by the checkpoint writer, manager and reader (checkpoint_files.h).
#include "trainer/checkpoint/checkpoint_files.h"

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

}  // namespace checkpoint_files

}  // namespace gmod

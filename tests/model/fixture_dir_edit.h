// Test helper for the load-error tests of the vision-tower families (tests/model/test_llava_hr.cpp,
// test_mgm.cpp): a copy of a committed fixture directory with some tensors dropped and its config.json edited,
// and the message `load_pretrained` stops with on it.
#pragma once

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "model/pretrained.h"
#include "model/safetensors.h"
#include "tests/common/paths.h"

namespace gmod::test {

// Copies fixture `name` (config.json + model.safetensors) to tmp/<dst>, keeping the tensors `keep` accepts and
// applying `edit` to the config; returns the copy's path.
inline std::string copy_fixture_dir(const TempDir& tmp, const std::string& name, const std::string& dst_name,
                                    const std::function<bool(const std::string&)>& keep,
                                    const std::function<void(nlohmann::json&)>& edit) {
  const std::string src = fixture(name);
  const std::string dst = (tmp.path / dst_name).string();
  std::filesystem::create_directories(dst);
  nlohmann::json j;
  std::ifstream(src + "/config.json") >> j;
  edit(j);
  std::ofstream(dst + "/config.json") << j.dump();
  SafetensorsFile f(src + "/model.safetensors");
  std::vector<std::pair<std::string, at::Tensor>> t;
  for (const auto& n : f.names())
    if (keep(n)) t.emplace_back(n, f.tensor(n));
  save_safetensors(dst + "/model.safetensors", t);
  return dst;
}

// The message load_pretrained(dir) throws, "" if it loads.
inline std::string load_error(const std::string& dir) {
  try {
    load_pretrained(dir);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace gmod::test

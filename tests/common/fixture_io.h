// Reading a parity fixture's committed reference files: its reference.json and raw float32 arrays (pixel values a
// generator saved with numpy's tofile). Failures are gtest failures naming the file, not exceptions.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace gmod::test {

// DIR/reference.json; `generator` names the script that writes it (the failure says how to make it).
inline nlohmann::json read_reference(const std::string& dir, const std::string& generator) {
  std::ifstream f(dir + "/reference.json");
  EXPECT_TRUE(f.good()) << "missing " << dir << "/reference.json (run " << generator << ")";
  return f.good() ? nlohmann::json::parse(f) : nlohmann::json::object();
}

// `count` float32 values from `path`.
inline std::vector<float> read_floats(const std::string& path, size_t count) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open fixture " << path;
  std::vector<float> out(count);
  f.read(reinterpret_cast<char*>(out.data()), std::streamsize(count * sizeof(float)));
  EXPECT_EQ(size_t(f.gcount()), count * sizeof(float)) << path;
  return out;
}

}  // namespace gmod::test

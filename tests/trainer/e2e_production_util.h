// Helpers of the end-to-end production-path tests (e2e_production.cpp): run the executable (under mpirun with
// ranks, with extra environment), read its per-step metrics and compare checkpoints bit for bit.
#pragma once

#include <ATen/ATen.h>
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "trainer/checkpoint.h"

namespace gmod::test {

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs a shell command line; returns its exit code (128 + signal when killed).
inline int run_shell(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

// step -> that step's metrics line (the last one when a step was run twice).
inline std::map<int64_t, nlohmann::json> step_metrics(const std::string& run_dir) {
  std::map<int64_t, nlohmann::json> out;
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out[j["step"].get<int64_t>()] = j;
  }
  return out;
}

inline bool bit_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  at::Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), size_t(x.numel()) * x.element_size()) == 0;
}

inline std::string ckpt(const std::string& run_dir, int64_t step) {
  return run_dir + "/checkpoints/step-" + std::to_string(step);
}

// The unpadded flat optimizer vector `name` [P], assembled from every rank's file.
inline at::Tensor flat_optimizer(const std::string& dir, const std::string& name) {
  std::vector<at::Tensor> parts;
  int64_t total = 0;
  for (auto& rs : CheckpointReader(dir).read_all_rank_states()) {
    total = rs.meta["layout"]["total"].get<int64_t>();
    for (auto& [n, t] : rs.tensors)
      if (n == name) parts.push_back(t.reshape({-1}));
  }
  return at::cat(parts).slice(0, 0, total);
}

}  // namespace gmod::test

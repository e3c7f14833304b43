// Helpers for the end-to-end `gmod train` tests (e2e_failures.cpp, e2e_train.cpp, e2e_production.cpp): the demo dataset, a config
// on the tiny demo model, running `gmod train` (plain or under mpirun, in the foreground or spawned), finding the
// ranks of a spawned mpirun, and comparing checkpoints bitwise.
#pragma once

#include "data/demo_dataset.h"
#include "tests/common/paths.h"
#include "trainer/checkpoint/checkpoint.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <dirent.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace gmod::e2e {

using json = nlohmann::json;

struct Env {
  gmod::test::TempDir tmp;
  std::string data;
  Env() {
    data = tmp.str("data");
    gmod::DemoDatasetOptions o;
    o.num_train = 40;
    o.num_heldout = 8;
    o.image_size = 32;
    gmod::make_demo_dataset(data, o);
  }
};
inline Env& env() {
  static Env e;
  return e;
}

// Config of every run (the demo model, 2-rank friendly); tests override with `extra` or --set.
inline std::string write_config(const std::string& run_dir, const json& extra = json::object()) {
  const std::string src = gmod::test::source_dir();
  json c{{"model", {{"path", src + "/configs/demo_model"}, {"init", "random"}, {"init_seed", 3}}},
         {"data",
          {{"train", env().data + "/train.json"}, {"tokenizer", src + "/tests/fixtures/tokenizer/sp/tokenizer.model"},
           {"max_len", 128}, {"workers", 1}}},
         {"optimizer", {{"lr", 2e-3}, {"warmup_steps", 2}, {"min_lr", 1e-4}, {"zero_stage", 1}}},
         {"batch", {{"micro_batch", 1}, {"global_batch", 4}}},
         {"schedule", {{"max_steps", 6}}},
         {"mod", {{"enabled", true}, {"rule", "arank_mod"}}},
         {"checkpoint", {{"every", 0}, {"keep_last", 3}}},
         {"parallel", {{"timeout_s", 5.0}}},
         {"seed", 11},
         {"deterministic", true},
         {"run_dir", run_dir},
         {"resume", "auto"}};
  c.merge_patch(extra);
  const std::string path = run_dir + ".config.json";
  std::ofstream(path) << c.dump(2);
  return path;
}

// The shell command of `gmod train` (np = 0: a plain process, else under mpirun), output appended to <config>.log.
inline std::string train_command(int np, const std::string& config, const std::vector<std::string>& sets = {}) {
  std::string cmd;
  if (np > 0)
    cmd = std::string(GMOD_MPIEXEC) + " " + GMOD_MPIEXEC_NP + " " + std::to_string(np) + " " + GMOD_MPIRUN_FLAGS + " ";
  cmd += std::string(GMOD_BIN) + " train --threads 1 --config " + config;
  for (const auto& s : sets) cmd += " --set '" + s + "'";
  return cmd + " >> " + config + ".log 2>&1";
}

inline int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

inline int gmod_train(int np, const std::string& config, const std::vector<std::string>& sets = {}) {
  return exit_code(std::system(train_command(np, config, sets).c_str()));
}

// `sh -c "<prefix> exec <command>"` in the background; returns the pid (that of mpirun once exec'd).
inline pid_t spawn_shell(const std::string& command) {
  std::vector<std::string> args{"/bin/sh", "-c", command};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, "/bin/sh", nullptr, nullptr, argv.data(), environ) != 0) return -1;
  return pid;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Children of `parent` by their OMPI_COMM_WORLD_RANK (the ranks mpirun started on this node).
inline std::map<int, pid_t> rank_pids(pid_t parent) {
  std::map<int, pid_t> out;
  DIR* d = opendir("/proc");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    const pid_t pid = pid_t(std::atoi(e->d_name));
    if (pid <= 0) continue;
    std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream ss(stat.substr(close + 2));
    char state;
    pid_t ppid = 0;
    ss >> state >> ppid;
    if (ppid != parent) continue;
    const std::string envs = slurp("/proc/" + std::to_string(pid) + "/environ");
    const std::string key = std::string("OMPI_COMM_WORLD_RANK=");
    for (size_t p = 0; p < envs.size(); p = envs.find('\0', p) + 1) {
      if (envs.compare(p, key.size(), key) == 0) out[std::atoi(envs.c_str() + p + key.size())] = pid;
      if (envs.find('\0', p) == std::string::npos) break;
    }
  }
  closedir(d);
  return out;
}

// True while the process exists and is not a zombie.
inline bool alive(pid_t pid) {
  const std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  return close != std::string::npos && stat.size() > close + 2 && stat[close + 2] != 'Z';
}

// step -> that step's metrics line (the last one when a step was run twice); `order`: the steps in file order.
// A line that does not parse is an error unless `partial_ok` (a file still being written by a live run).
inline std::map<int64_t, json> step_metrics(const std::string& run_dir, std::vector<int64_t>* order = nullptr,
                                            bool partial_ok = false) {
  std::map<int64_t, json> out;
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    json j;
    try {
      j = json::parse(line);
    } catch (const std::exception&) {
      if (partial_ok) continue;
      throw;
    }
    if (!j.contains("loss")) continue;
    if (order) order->push_back(j["step"].get<int64_t>());
    out[j["step"].get<int64_t>()] = j;
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

inline void expect_same_model(const std::string& a, const std::string& b) {
  auto ma = gmod::CheckpointReader(a).read_model(), mb = gmod::CheckpointReader(b).read_model();
  ASSERT_EQ(ma.size(), mb.size());
  for (size_t i = 0; i < ma.size(); ++i) {
    EXPECT_EQ(ma[i].first, mb[i].first);
    EXPECT_TRUE(bit_equal(ma[i].second, mb[i].second)) << ma[i].first;
  }
}

// Runs a shell command line; returns its exit code (128 + signal when killed).
inline int run_shell(const std::string& cmd) { return exit_code(std::system(cmd.c_str())); }

// The unpadded flat optimizer vector `name` [P], assembled from every rank's file.
inline at::Tensor flat_optimizer(const std::string& dir, const std::string& name) {
  std::vector<at::Tensor> parts;
  int64_t total = 0;
  for (auto& rs : gmod::CheckpointReader(dir).read_all_rank_states()) {
    total = rs.meta["layout"]["total"].get<int64_t>();
    for (auto& [n, t] : rs.tensors)
      if (n == name) parts.push_back(t.reshape({-1}));
  }
  return at::cat(parts).slice(0, 0, total);
}

}  // namespace gmod::e2e

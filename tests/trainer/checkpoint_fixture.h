// Shared by the checkpoint tests: a small model with a 2-way ZeRO layout, saves from simulated ranks (in order, no-op
// barrier), byte flips, collected warnings, a thread barrier.
#pragma once

#include "trainer/checkpoint/checkpoint.h"

#include "tests/common/paths.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using gmod::CheckpointContent;
using gmod::CheckpointManager;
using gmod::CheckpointOptions;
using gmod::CheckpointReader;
using gmod::CheckpointWriter;
using gmod::RankState;
using gmod::SaveStage;
using gmod::test::TempDir;


inline bool bit_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  at::Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), size_t(x.numel()) * x.element_size()) == 0;
}

// Every 16-bit pattern once (NaNs, infinities, subnormals, -0), as the given 2-byte dtype.
inline at::Tensor all_16bit_patterns(at::ScalarType t) {
  at::Tensor bits = at::arange(0, 65536, at::kInt).to(at::kShort);  // wraps to all int16 values
  return bits.view(t).reshape({256, 256});
}

inline void flip_byte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f) << path;
  f.seekg(std::streamoff(offset));
  char c;
  f.get(c);
  c = char(c ^ 0x5a);
  f.seekp(std::streamoff(offset));
  f.put(c);
}

// Reusable barrier for ranks simulated by threads.
class ThreadBarrier {
 public:
  explicit ThreadBarrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(m_);
    int gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen_ != gen; });
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, count_ = 0, gen_ = 0;
};

// A small model and a 2-way ZeRO layout over its flat fp32 vector (padding at the tail).
struct Fixture {
  gmod::NamedTensors model;
  nlohmann::json layout;
  at::Tensor flat_master, flat_avg, flat_sq;  // [total]
  int64_t total = 0;

  explicit Fixture(int64_t seed = 0) {
    at::Tensor w = (at::arange(12, at::kFloat).reshape({3, 4}) / 8).to(at::kBFloat16);
    at::Tensor b = at::arange(4, at::kFloat) + 0.25;
    at::Tensor e = (at::arange(10, at::kFloat).reshape({5, 2}) * 0.1 + double(seed)).to(at::kBFloat16);
    model = {{"layers.0.weight", w}, {"norm.weight", b}, {"embed.weight", e}};
    layout = nlohmann::json::array();
    for (const auto& [n, t] : model) {
      layout.push_back({{"name", n}, {"shape", t.sizes().vec()}, {"offset", total}, {"numel", t.numel()}});
      total += t.numel();
    }
    flat_master = at::arange(total, at::kFloat) * 0.5 + double(seed);
    flat_avg = at::arange(total, at::kFloat) * -1e-3;
    flat_sq = at::arange(total, at::kFloat) * 1e-6;
  }
  CheckpointContent content(int64_t step) const {
    CheckpointContent c;
    c.step = step;
    c.config = {{"model", "tiny"}, {"lr", 2e-5}};
    c.trainer_state = {{"scheduler", {{"last_step", step}, {"base_lr", 2e-5}}}};
    c.data_position = {{"consumed_samples", step * 8}, {"epoch", 0}};
    c.shard_layout = {{"params", layout}, {"total", total}};
    c.model = model;
    return c;
  }
  // Rank r of `world`: contiguous slice of the flat vectors padded to a multiple of world.
  RankState rank_state(int r, int world, int64_t step) const {
    int64_t per = (total + world - 1) / world;
    int64_t begin = std::min(total, r * per), end = std::min(total, (r + 1) * per);
    RankState s;
    s.tensors = {{"master", flat_master.slice(0, begin, end)},
                 {"exp_avg", flat_avg.slice(0, begin, end)},
                 {"exp_avg_sq", flat_sq.slice(0, begin, end)},
                 {"step", at::scalar_tensor(step, at::kLong)}};
    s.meta = {{"shard_begin", begin}, {"shard_end", end}, {"padding", (r + 1) * per - end}};
    at::Generator g = at::make_generator<at::CPUGeneratorImpl>(uint64_t(1000 + r));
    s.rng_state = gmod::generator_state_bytes(g);
    return s;
  }
};

// Saves one checkpoint from `world` simulated ranks called in order world-1 .. 0 with a no-op barrier; `job` = ""
// is this process, anything else simulates another job.
inline std::string save_sequential(const std::string& run, const Fixture& fx, int64_t step, int world, int keep = 3,
                            std::function<void(SaveStage)> rank0_hook = nullptr, const std::string& job = "",
                            std::function<void(const std::string&)> warn = nullptr) {
  std::string out;
  for (int r = world - 1; r >= 0; --r) {
    CheckpointOptions o;
    o.keep_last = keep;
    o.barrier = [] {};
    o.job_id = job;
    o.warn = warn;
    if (r == 0) o.on_stage = rank0_hook;
    out = CheckpointWriter(run, r, world, o).save(fx.content(step), fx.rank_state(r, world, step));
  }
  return out;
}

struct Warnings {
  std::vector<std::string> msgs;
  std::function<void(const std::string&)> fn() {
    return [this](const std::string& m) { msgs.push_back(m); };
  }
};

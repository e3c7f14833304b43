// TensorBoard event files (metrics.tensorboard: true): rank 0 writes every metrics.jsonl line and every evaluation
// as scalars into <run_dir>/tensorboard/events.out.tfevents.<seconds>.<host>.<pid>.gmod, which TensorBoard (and
// W&B's TensorBoard sync) read. The file is TensorFlow's record format: per record the little-endian uint64 length,
// its masked CRC-32C, the bytes, their masked CRC-32C; each record one serialized `Event` protocol buffer (the few
// fields used are encoded here: wall_time, step, file_version, summary of simple_value scalars, session_log).
// The first record is file_version "brain.Event:2". A run that resumes at step S writes a SessionLog START at step
// S + 1: TensorBoard then drops what an earlier attempt logged from S + 1 on (the steps this run computes again),
// so a resumed run's curves have no doubled stretch.
// Tags: the JSON's keys, nested objects joined with "/" ("loss", "memory/rss_mb", "skip_ratio/3", "eval/loss");
// booleans as 0/1; strings and arrays are left out. A failed write is warned about once and the writer stops (the
// metrics.jsonl stays the record of the run).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace gmod {

// CRC-32C (Castagnoli), and TensorFlow's masked form of it (rotate right by 15, add 0xa282ead8).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
uint32_t masked_crc32c(const void* data, size_t n);

class TensorBoardWriter {
 public:
  // Creates `dir` and the event file. resume_step > 0: the run continues after that step (SessionLog START at
  // resume_step + 1). warn receives the one warning of a failed write.
  TensorBoardWriter(const std::string& dir, int64_t resume_step, std::function<void(const std::string&)> warn);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One Event at `step` with every number of `j` (except a top-level "step") as a scalar tagged prefix + key path.
  void scalars(int64_t step, const nlohmann::json& j, const std::string& prefix = "");
  const std::string& path() const { return path_; }

  // The (tag, value) pairs scalars() writes for j (for tests and for the docs' tag list).
  static std::vector<std::pair<std::string, float>> flatten(const nlohmann::json& j, const std::string& prefix = "");

 private:
  void record(const std::string& event);
  std::string path_;
  std::FILE* f_ = nullptr;
  bool failed_ = false;
  std::function<void(const std::string&)> warn_;
};

}  // namespace gmod

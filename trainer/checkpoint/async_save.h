// An asynchronous checkpoint save (checkpoint.async): the state, already copied to host memory that the save owns,
// is written by a background thread (CheckpointWriter::write_files) while training goes on; the commit (manifest,
// rename, retention) happens on rank 0 once every rank's thread has finished, decided collectively between steps by
// the trainer. At most one is in flight. A failed write leaves only step-N.tmp/ (the previous checkpoint is never
// touched) and is reported by error(); the destructor waits for the thread. Debian's HDF5 is not built thread-safe:
// while the thread runs, nothing else in the process may call HDF5 (the trainer opens no checkpoint file until
// done(); the commit reads the parts only after it).
#pragma once

#include "trainer/checkpoint/checkpoint.h"

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace gmod {

class AsyncCheckpointSave {
 public:
  // Starts the background write. `content` and `mine` must not share memory with tensors training will modify.
  // With `background_priority` (the default) the writer thread, and the threads it starts, run at nice +10 and the
  // lowest best-effort I/O priority: where training keeps every core busy (a CPU run, data workers) the write takes
  // what is left instead of slowing the steps (bench/bench_checkpoint.py measures the step beside a write both ways).
  AsyncCheckpointSave(CheckpointWriter writer, CheckpointContent content, RankState mine,
                      bool background_priority = true);
  ~AsyncCheckpointSave();
  AsyncCheckpointSave(const AsyncCheckpointSave&) = delete;
  AsyncCheckpointSave& operator=(const AsyncCheckpointSave&) = delete;

  int64_t step() const { return content_.step; }
  bool done() const { return done_.load(std::memory_order_acquire); }  // this rank's write ended (or failed)
  void wait();                                    // until done()
  const std::string& error() const { return error_; }  // after done(): "" or what failed
  double write_seconds() const { return write_seconds_; }  // after done()
  // Rank 0, after every rank is done without error: commits and returns the final directory.
  std::string commit() { return writer_.commit(content_); }
  std::string final_dir() const { return writer_.final_dir(content_.step); }

 private:
  CheckpointWriter writer_;
  CheckpointContent content_;
  RankState mine_;
  std::atomic<bool> done_{false};
  std::string error_;
  double write_seconds_ = 0;
  std::thread thread_;
};

// The host memory asynchronous saves copy the state into: one buffer, exactly the size of the largest snapshot so
// far (page-locked on CUDA through parallel/pinned_host.h, not the caching host allocator's power-of-two blocks,
// so what `gmod plan` states is what is pinned), reused by every later save. Only one save is in flight and the
// trainer waits for it before taking the next snapshot, so a reuse never overwrites tensors still being written.
class SnapshotArena {
 public:
  // Starts a snapshot of tensors of these sizes in bytes (each copy starts 64-byte aligned); grows the buffer first
  // when it is smaller. `pinned`: the sources live on CUDA.
  void begin(const std::vector<int64_t>& tensor_bytes, bool pinned);
  // A host copy of `t` in the arena, after the previous ones of this snapshot.
  at::Tensor take(const at::Tensor& t);
  int64_t capacity_bytes() const { return buf_.defined() ? buf_.numel() : 0; }
  // Writes every page of the buffer once, so that the first snapshot copies into memory already mapped.
  void touch();

 private:
  at::Tensor buf_;  // [capacity] uint8
  int64_t used_ = 0;
};

// Bytes an asynchronous save of these tensors holds in host memory (what `gmod plan` adds for checkpoint.async).
int64_t snapshot_bytes(const NamedTensors& ts);

}  // namespace gmod

// This rank's stream of micro-batches: background workers prepare (parse, template, tokenise, decode and
// preprocess images, collate) micro-batches into a bounded prefetch window; next() hands them out in order.
// Micro-batch k is a pure function of (dataset, sampler config, start position, k), and workers fill slots by
// sequence number, so the output is identical for any number of workers.
// Bad records (see Dataset::prepare) are skipped - the micro-batch gets fewer rows - counted by reason, and
// logged once per record; past max_bad_records or max_bad_fraction next() throws.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "data/batch.h"
#include "data/sampler.h"

namespace gmod {

struct LoaderConfig {
  int micro_batch_size = 1;  // rows per micro-batch on this rank (mb)
  int rank = 0;
  int world_size = 1;
  SamplerConfig sampler;           // seed, global batch size G (a multiple of world_size * mb), grouping
  int num_workers = 2;             // preparation threads; 0 prepares synchronously inside next()
  int prefetch = 4;                // micro-batches prepared ahead (>= 1)
  int64_t max_bad_records = -1;    // -1: no limit on the count
  double max_bad_fraction = 0.05;  // of the records this rank has seen, checked after `bad_fraction_min_seen`
  int64_t bad_fraction_min_seen = 200;
  bool log_bad_records = true;  // one line per skipped record on stderr
  // Page-lock every batch's tensors in the workers (set it when the model runs on CUDA): to_model_inputs then
  // copies them to the device asynchronously instead of through a synchronous pageable copy on the training
  // thread.
  bool pin_memory = false;
  // > 0: each micro-batch's samples packed into rows of at most this many tokens (data/pack.h); 0: padded rows.
  int64_t pack_to = 0;
};

struct LoaderStats {
  int64_t batches = 0;
  int64_t samples = 0;  // rows delivered
  int64_t seen = 0;     // records looked at (delivered + skipped)
  int64_t tokens = 0;   // non-pad tokens delivered
  int64_t truncated = 0;
  std::map<std::string, int64_t> bad_by_reason;
  int64_t bad() const;
};

class DataLoader {
 public:
  // `dataset` must outlive the loader. Throws std::invalid_argument on inconsistent sizes or a position that
  // is not on a micro-step boundary.
  DataLoader(const Dataset& dataset, LoaderConfig config, DataPosition start = {});
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // This rank's next micro-batch (epochs roll over automatically). Rethrows a worker's error.
  Batch next();
  // Position after the last micro-batch returned by next(); identical on all ranks. Save it with the
  // checkpoint.
  DataPosition position() const;
  // Seconds next() spent waiting for a batch, cumulative.
  double wait_seconds() const;
  LoaderStats stats() const;
  // Global samples per micro-step (world_size * mb), micro-steps per optimizer step, per epoch.
  int64_t micro_step_samples() const { return step_samples_; }
  int64_t accumulation_steps() const { return config_.sampler.global_batch_size / step_samples_; }
  int64_t micro_steps_per_epoch() const { return steps_per_epoch_; }

 private:
  Batch build(int64_t seq);
  std::shared_ptr<const std::vector<size_t>> order_for(int64_t epoch);
  void worker_loop();

  const Dataset& dataset_;
  LoaderConfig config_;
  std::vector<int64_t> lengths_;  // for grouping
  int64_t step_samples_ = 0;
  int64_t steps_per_epoch_ = 0;
  int64_t first_step_ = 0;  // global micro-step index of sequence 0

  std::mutex order_mu_;
  std::map<int64_t, std::shared_ptr<const std::vector<size_t>>> orders_;

  mutable std::mutex mu_;
  std::condition_variable cv_work_, cv_ready_;
  std::map<int64_t, Batch> ready_;
  std::map<int64_t, std::exception_ptr> errors_;
  int64_t next_produce_ = 0, next_consume_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;

  double wait_s_ = 0;
  LoaderStats stats_;
  std::set<size_t> logged_;
};

}  // namespace gmod

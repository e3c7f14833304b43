// Per-step training metrics: what one optimizer step did (losses, grad norm, LR, throughput, MFU, MoD skip ratios,
// data-wait share, memory, skipped steps) and the rank-0 logger that appends one JSON
// object per logged step to <run>/metrics.jsonl and shows progress (a redrawn bar with ETA on a TTY, plain lines
// otherwise; under mpirun plain lines unless GMOD_PROGRESS=bar).
//
// metrics.jsonl is written with one write(2) per line on an O_APPEND descriptor. Every write is checked: a failed or
// short one is undone (the file truncated back to its last complete line), warned about once, and after
// `max_write_failures` failures in a row log() throws naming the file and the system's reason. When the logger opens
// an existing file whose last line is torn (an interrupted write, a crash), it repairs it first and says so: a torn
// last line that is a complete JSON object only lacks its newline and gets it, anything else is cut off.
//
// FLOPs (trainer/flops.h): forward + backward of what each layer really processed (MoD layers: the kept tokens and
// their attention pairs), plus LM head, projector and vision tower (frozen parts: forward only, or forward plus the
// activation gradients when something before them trains), summed over micro-batches and ranks. MFU = flops / step
// time / peak; `dense_flops` is the dense model on the same tokens, so flops / dense_flops is the realised saving.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace gmod {

class TensorBoardWriter;

// Default peak TFLOP/s per rank for MFU (see MetricsSection::peak_tflops).
double default_peak_tflops(const at::Device& device, at::ScalarType dtype);

// Host or accelerator memory of this process: {"rss_mb"} on CPU; {"cuda_alloc_mb", "cuda_peak_alloc_mb",
// "cuda_reserved_mb", "cuda_peak_reserved_mb", "cuda_alloc_retries", "cuda_ooms"} on CUDA (caching-allocator
// statistics), plus rss_mb.
nlohmann::json memory_stats(const at::Device& device);

struct StepMetrics {
  int64_t step = 0;            // global optimizer step just completed (1-based)
  int64_t total_steps = 0;
  int64_t epoch = 0;
  int64_t consumed_samples = 0;  // in the epoch, after this step
  double loss = 0, lm_loss = 0, routing_loss = 0;  // loss = lm_loss + λ·routing_loss (global, token-normalised)
  double grad_norm = 0, lr = 0;
  int64_t samples = 0, tokens = 0, supervised_tokens = 0;  // global, this step
  int64_t padded_tokens = 0;  // global positions computed, padding included (B x L summed over micro-batches)
  double step_seconds = 0;     // wall time of the step on rank 0
  double data_wait_seconds = 0;  // rank 0's time blocked in the loader during the step
  double flops = 0;            // model FLOPs of the step as executed (MoD: kept tokens only), all ranks
  double dense_flops = 0;      // the dense model's FLOPs on the same tokens, all ranks
  bool skipped = false;        // optimizer skipped the update (non-finite gradient)
  int64_t skipped_total = 0;
  std::map<int, double> skip_ratio;  // MoD layer -> share of all valid tokens it skipped (the paper's α; global)
  std::map<int, double> skip_ratio_routable;  // MoD layer -> share of its routable tokens it skipped (global)
  // optimizer.groups: the LR each group stepped with ("default" = lr above), in group order; empty without groups.
  std::vector<std::pair<std::string, double>> lr_groups;
};

class MetricsLogger {
 public:
  // Rank 0 passes the run directory (appends to <run>/metrics.jsonl); other ranks construct with enabled = false.
  // peak_flops: the whole job's peak FLOP/s (ranks x per-rank peak).
  MetricsLogger(const std::string& run_dir, bool enabled, double peak_flops, int64_t first_step,
                int max_write_failures = 5);
  ~MetricsLogger();

  // metrics.tensorboard: every step line and evaluation also goes to TensorBoard event files in `dir`
  // (trainer/tensorboard_events.h); resume_step > 0 when the run continues from a checkpoint of that step.
  void write_tensorboard(const std::string& dir, int64_t resume_step);
  // Writes the step's JSON line and updates the progress display. Returns the JSON (also when disabled).
  nlohmann::json log(const StepMetrics& m, const nlohmann::json& memory);
  // An evaluation result: {"eval": {...}, "step": n} line + a printed summary.
  void log_eval(int64_t step, const nlohmann::json& eval);
  // Prints a message on its own line (keeps the progress bar intact).
  void print(const std::string& msg);
  // Ends the progress line.
  void finish();
  // Write failures so far (all, and in a row now).
  int64_t write_failures() const { return failures_total_; }

  // Makes the last line of `path` complete (see above); "" when it was, else what was done (for the log).
  static std::string repair_torn_tail(const std::string& path);

 private:
  void write(const nlohmann::json& j);
  bool enabled_;
  bool tty_;
  double peak_flops_;
  int64_t first_step_;
  int max_write_failures_;
  std::chrono::steady_clock::time_point start_;
  std::string path_;
  int fd_ = -1;
  int failures_in_row_ = 0;
  int64_t failures_total_ = 0;
  bool newline_first_ = false;  // a partial line could not be undone
  bool bar_drawn_ = false;
  std::unique_ptr<TensorBoardWriter> tb_;
};

}  // namespace gmod

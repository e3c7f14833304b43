// The trainer: one class that sets a run up (model, MoD conversion, freezing, data-parallel optimizer, this rank's
// data stream, resume) and runs the loop (gradient accumulation, optimizer step, LR schedule, metrics, evaluation,
// checkpoints, SIGTERM/SIGINT/SIGUSR1 handling). Parallelism comes from parallel/: a Comm and one DpStrategy
// (parallel/dp_strategy.h) for whatever ZeRO stage and offload the config asks (ZeRO-3's reaches the model only
// through model/unit_hooks.h); the model knows nothing about it.
//
// Loss normalisation (so that results do not depend on the world size or on how a step is cut into micro-batches):
// before the first forward of a step every rank counts the supervised (shifted, label != -100) tokens of all its
// micro-batches and one all-reduce gives the step's global count N. Micro-batch m on rank r then back-propagates
//   world * lm_loss_sum(m, r) / N  +  λ Σ_l routing_loss_l(m, r) / accum
// and the optimizer averages gradients over ranks, so the gradient is that of
//   Σ_{m,r} lm_loss_sum(m, r) / N  +  λ · mean_{m,r} Σ_l routing_loss_l(m, r),
// i.e. every supervised token of the global batch weighs the same (not every micro-batch). The logged lm_loss is the
// same quantity computed from all-reduced sums.
//
// Run dir: rank 0 holds an exclusive lock on <run_dir>/.lock (trainer/checkpoint/run_lock.h) from before anything is written
// until the trainer is destroyed, so a second job on the same run_dir stops at once, naming the holder.
//
// Resume: `resume = auto` takes the newest checkpoint of run_dir whose manifest and CRCs verify (newer broken ones are
// reported and set aside as step-<N>.corrupt; checkpoints that exist but are all broken stop the run unless
// `resume = auto_or_scratch`). At another world size (or ZeRO stage) the optimizer state is resharded exactly
// (reshard_state), the data stream continues from the saved DataPosition (a permutation prefix, independent of the
// world size; the global batch must stay a multiple of world x micro_batch), and the ranks' generators are reseeded
// from (seed, step, rank) since old and new ranks do not correspond; at the same world size each rank's CPU generator
// state is restored.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/loader.h"
#include "model/llava.h"
#include "parallel/comm.h"
#include "parallel/dp_strategy.h"
#include "trainer/flops.h"
#include "trainer/lr_schedule.h"
#include "trainer/metrics.h"
#include "trainer/checkpoint/async_save.h"
#include "trainer/step_profiler.h"
#include "trainer/checkpoint/run_lock.h"
#include "trainer/config/param_groups.h"
#include "trainer/config/train_config.h"
#include "trainer/run_plan.h"

namespace gmod {

// Result of Trainer::run().
struct TrainResult {
  int64_t final_step = 0;
  bool stopped_by_signal = false;
  std::string last_checkpoint;  // "" when none was written
};

class Trainer {
 public:
  // Sets everything up from `plan`, resolved for comm's world size (read_run_plan: read and validated there, not
  // again here). Collective: every rank constructs one.
  Trainer(RunPlan plan, std::shared_ptr<Comm> comm);
  ~Trainer();

  // Trains until max_steps / epochs / exit_at_step or a SIGTERM/SIGINT/SIGUSR1 (then finishes the step, saves and returns).
  TrainResult run();

  // Evaluation on eval.data: {"loss", "supervised_tokens", "samples", "exact_match"?, "exact_match_samples"?,
  // "skip_ratio"?} (loss token-normalised over all ranks). Collective.
  nlohmann::json evaluate();
  // Saves a checkpoint of the current step (collective); returns its directory. With checkpoint.async (and
  // allow_async) it starts a background save and returns "" (the directory is committed by a later step's poll).
  std::string save_checkpoint(bool allow_async = true);

  int64_t step() const { return step_; }
  int64_t total_steps() const { return total_steps_; }
  MultimodalLM& model() { return *model_; }
  // The data-parallel strategy (optimizer, gradient reductions, ZeRO-3's gathers) of every ZeRO stage.
  DpStrategy& data_parallel() { return *dp_; }
  const TrainConfig& config() const { return cfg_; }

 private:
  void reserve_snapshot();  // checkpoint.async: the host snapshot made at start (trainer_save.cpp)
  std::vector<int64_t> held_bytes(const std::vector<int64_t>& bytes, const std::vector<int>& owner,
                                  const AdamWShardState& st) const;
  void load_model();
  void convert_model();            // MoD conversion (ARank first when the rule needs it)
  std::vector<double> run_arank();
  void freeze_and_count();         // requires_grad, trainable list, FLOP model
  void setup_optimizer();  // trainer_optimizer.cpp: the data-parallel strategy dp_ from the optimizer section
  std::vector<double> group_lrs() const;  // this step's LR of every group (optimizer.groups) from the schedule
  void setup_data();
  bool resume_is_auto() const { return cfg_.resume == "auto" || cfg_.resume == "auto_or_scratch"; }
  // Before any work (collective): verifies the checkpoint to resume from and sets resume_dir_ ("" = from scratch);
  // `auto` with checkpoints but none valid throws; newer invalid ones are set aside as step-<N>.corrupt.
  void choose_resume();
  void resume_if_requested();  // loads resume_dir_ (after model, data and optimizer exist)
  std::string load_resume_dir();  // one attempt: "" or why resume_dir_ failed while read (the same on every rank)
  // Throws (or warns with resume_allow_changes) when seed, data, batch or model parts differ from the checkpoint's.
  void check_resume_compatible(const std::string& dir, const nlohmann::json& saved_cfg,
                               const nlohmann::json& saved_state) const;
  StepMetrics train_step();
  void print(const std::string& msg) const;  // rank 0

  const RunPlan plan_;
  // plan_.config, completed by what set-up finds (the MoD configuration after conversion, the conversation
  // template the tokenizer implies): what checkpoints and run_dir/config.json record.
  TrainConfig cfg_;
  std::shared_ptr<Comm> comm_;
  int rank_ = 0, world_ = 1;
  at::Device device_{at::kCPU};
  at::ScalarType dtype_ = at::kFloat;
  int accum_ = 1;
  int64_t global_batch_ = 1;

  std::shared_ptr<MultimodalLM> model_;
  std::vector<std::pair<std::string, at::Tensor>> trainable_;
  ResolvedParamGroups param_groups_;   // optimizer.groups resolved against the model (freeze_and_count)
  std::vector<int> trainable_group_;   // per trainable_ entry: its group in param_groups_
  std::unique_ptr<DpStrategy> dp_;  // every ZeRO stage, with or without offload
  std::unique_ptr<LRSchedule> sched_;
  TrainableParts flop_parts_;  // what the step FLOPs (MFU) count a backward for
  std::vector<int> mod_layers_;

  std::shared_ptr<const Tokenizer> tokenizer_;
  std::unique_ptr<Dataset> train_set_, eval_set_;
  std::unique_ptr<DataLoader> loader_;
  std::unique_ptr<RunDirLock> run_lock_;  // rank 0: held for the trainer's lifetime
  std::string resume_dir_;
  double resume_verify_s_ = 0;  // choose_resume's time (the CRC checks), printed by resume_if_requested
  std::map<std::string, std::string> corrupt_on_load_;  // checkpoints whose tensors failed their CRCs while read
  DataPosition start_position_;
  nlohmann::json saved_schedule_;  // LR schedule state from the checkpoint (null when starting fresh)
  std::unique_ptr<MetricsLogger> logger_;

  int64_t step_ = 0;
  int64_t total_steps_ = 0;
  int64_t skipped_total_ = 0;
  int consecutive_skipped_ = 0;
  int64_t last_saved_step_ = -1;
  std::string last_checkpoint_;
  bool stop_requested_ = false;
  // checkpoint.async: the save in flight (at most one), polled collectively after every step.
  std::unique_ptr<AsyncCheckpointSave> pending_save_;
  SnapshotArena snapshot_arena_;  // host memory of asynchronous saves, reused (trainer/checkpoint/async_save.h)
  std::unique_ptr<StepProfiler> profiler_;  // metrics.profile_steps
  // Start-up phases (seconds), printed with the time to the first step ("startup: ..." after it).
  double model_load_s_ = 0, data_index_s_ = 0, lengths_s_ = 0;
  // Collective: commits the save in flight once every rank has written it (waiting for that with `wait`); a failed
  // background write on any rank is a named error here.
  void poll_async_save(bool wait);
  std::string verify_spread(const std::string& dir);  // collective CRC check of one checkpoint (trainer_resume.cpp)
};

// Seed of rank `rank`'s generators for a run starting (or restarting at another world size) at `step`.
uint64_t rank_seed(uint64_t seed, int64_t step, int rank);

// Set by the SIGTERM/SIGINT/SIGUSR1 handler; the loop agrees on it across ranks after every step, and once before the
// first (a signal during set-up: the job ends cleanly there, with a message, nothing trained, nothing saved).
std::atomic<bool>& stop_signal_flag();
// Installs that handler for SIGTERM, SIGINT and SIGUSR1. gmod train calls it first thing, before MPI and set-up, so
// that a signal during set-up is recorded instead of killing the rank; Trainer::run installs it too.
void install_stop_signal_handlers();

}  // namespace gmod

// Trainer's checkpoint saves: what a save holds (weights split over the ranks, each rank's optimizer shard and RNG
// state), synchronous or asynchronous (host snapshot, background write, commit by rank 0 once every rank is done).
#include "trainer/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <array>
#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "model/trace_range.h"
#include "parallel/watchdog.h"
#include "trainer/fault_injection.h"
#include "trainer/checkpoint/async_save.h"
#include "trainer/checkpoint/checkpoint.h"

namespace gmod {
namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// "prepare A ms, write B ms, ...": the phases, from the stages a sync save reached on this rank: prepare =
// the state handed to the writer, write = this rank's files written and fsynced (rank 0: model.h5 first), sync = the
// ranks met, commit = rank 0's manifest, rename and retention (the others wait in the final barrier: "sync").
std::string save_phases(double prepared, const std::array<double, kNumSaveStages>& at, double end) {
  auto ms = [](double a, double b) { return std::to_string(int((b - a) * 1000)) + " ms"; };
  const double written = at[size_t(SaveStage::kRankFileWritten)];
  const double synced = at[size_t(SaveStage::kRanksSynced)];
  const double pruned = at[size_t(SaveStage::kPruned)];
  std::string out = "prepare " + ms(0, prepared) + ", write " + ms(prepared, written);
  if (synced >= 0 && pruned >= 0)  // rank 0
    return out + ", sync " + ms(written, synced) + ", commit " + ms(synced, pruned) + ", sync " + ms(pruned, end);
  return out + ", sync and wait for the commit " + ms(written, end);
}
}  // namespace

// The tensors an asynchronous save of this rank copies to host memory, in bytes: its share of the weights (`bytes`
// of every parameter, `owner` from split_model_by_bytes) and its optimizer shard.
std::vector<int64_t> Trainer::held_bytes(const std::vector<int64_t>& bytes, const std::vector<int>& owner,
                                         const AdamWShardState& st) const {
  std::vector<int64_t> held;
  for (size_t k = 0; k < owner.size(); ++k)
    if (owner[k] == rank_) held.push_back(bytes[k]);
  for (const at::Tensor* t : {&st.master, &st.exp_avg, &st.exp_avg_sq})
    held.push_back(t->numel() * int64_t(t->element_size()));
  return held;
}

// checkpoint.async: the snapshot buffer made and touched at start, so that the first save stalls only for its copy
// (not for the allocation and the page faults of gigabytes: 570 ms against 108-143 ms for later saves, issue 47).
void Trainer::reserve_snapshot() {
  const AdamWShardState st = dp_->state_dict();
  dp_->with_full_params([&] {
    std::vector<int64_t> bytes;
    for (auto& item : model_->named_parameters())
      bytes.push_back(item.value().numel() * int64_t(item.value().element_size()));
    snapshot_arena_.begin(held_bytes(bytes, split_model_by_bytes(bytes, world_), st), device_.is_cuda());
  });
  snapshot_arena_.touch();
}

std::string Trainer::save_checkpoint(bool allow_async) {
  const auto t0 = Clock::now();
  const TraceRange range("gmod::checkpoint");
  const bool async = allow_async && cfg_.checkpoint.async;
  // At most one save in flight: a save due while the previous one still writes waits for it first (timed on its own:
  // that wait is the disk's pace, not the copy's).
  double waited_s = 0;
  if (pending_save_) {
    const auto w0 = Clock::now();
    poll_async_save(/*wait=*/true);
    waited_s = seconds_since(w0);
  }
  // Asynchronous: every tensor copied to host memory the save owns (training then changes the originals): the
  // reused snapshot arena, sized once the weights this rank writes are known.
  auto keep = [&](const at::Tensor& t) { return async ? snapshot_arena_.take(t) : t.detach(); };
  CheckpointContent c;
  c.step = step_;
  c.config = to_json(cfg_);
  c.trainer_state = {{"lr_schedule", sched_->state()},
                     {"param_groups", param_groups_.to_json()},
                     {"skipped_total", skipped_total_},
                     {"global_batch", global_batch_},
                     {"dataset_records", int64_t(train_set_->size())},
                     {"world_size", world_},
                     {"grad_accum", accum_}};
  c.data_position = to_json(loader_->position());
  const AdamWShardState st = dp_->state_dict();
  c.shard_layout = {{"layout", st.layout.to_json()}, {"stage", st.stage}};
  // The weights are written by all ranks, each its share (split_model_by_bytes); a strategy whose full parameters
  // are transient (ZeRO-3) copies its share of the gathered parameters.
  dp_->with_full_params([&] {
    std::vector<int64_t> bytes;
    for (auto& item : model_->named_parameters()) {
      c.model_names.push_back(item.key());
      bytes.push_back(item.value().numel() * int64_t(item.value().element_size()));
    }
    const std::vector<int> owner = split_model_by_bytes(bytes, world_);
    if (async) snapshot_arena_.begin(held_bytes(bytes, owner, st), device_.is_cuda());
    size_t i = 0;
    for (auto& item : model_->named_parameters())
      if (owner[i++] == rank_)
        c.model.emplace_back(item.key(), dp_->full_params_transient() && !async ? item.value().detach().clone()
                                                                                : keep(item.value()));
  });
  RankState mine;
  mine.tensors = {{"master", keep(st.master)}, {"exp_avg", keep(st.exp_avg)}, {"exp_avg_sq", keep(st.exp_avg_sq)}};
  mine.meta = st.meta();
  mine.rng_state = generator_state_bytes(at::detail::getDefaultCPUGenerator());
  if (device_.is_cuda()) mine.cuda_rng_state = generator_state_bytes(at::globalContext().defaultGenerator(device_));
  CheckpointOptions o;
  o.keep_last = cfg_.checkpoint.keep_last;
  o.barrier = [this] { comm_->barrier(); };
  o.warn = [this](const std::string& w) { print("warning: " + w); };
  // When each stage of the protocol was reached (seconds since the save began; the sync save prints them).
  auto reached = std::make_shared<std::array<double, kNumSaveStages>>();
  reached->fill(-1.0);
  const double prepared = seconds_since(t0);
  // GMOD_FAULT_INJECT slow_save (tests: a node lost inside a save); runs in an asynchronous save's thread too.
  o.on_stage = [step = step_, rank = rank_, reached, t0](SaveStage s) {
    (*reached)[size_t(s)] = seconds_since(t0);
    if (s == SaveStage::kRankFileWritten) inject_save_delay(step, rank);
  };
  CheckpointWriter writer(cfg_.run_dir, rank_, world_, o);
  last_saved_step_ = step_;
  if (async) {
    const int64_t held = snapshot_bytes(c.model) + snapshot_bytes(mine.tensors);
    pending_save_ = std::make_unique<AsyncCheckpointSave>(std::move(writer), std::move(c), std::move(mine));
    const int waited_ms = int(waited_s * 1000);
    print("checkpoint: step " + std::to_string(step_) + " copied to host in " +
          std::to_string(int((seconds_since(t0) - waited_s) * 1000)) + " ms (" + std::to_string(held >> 20) +
          " MiB on this rank), writing in the background" +
          (waited_ms > 0 ? "; before it waited " + std::to_string(waited_ms) + " ms for the previous save's write"
                         : std::string()));
    return "";
  }
  // The others wait in the save's barriers while rank 0 commits (manifest, rename, retention): a phase with its
  // own deadline.
  const PhaseDeadline phase("checkpoint save (every rank writes its share; rank 0 commits and applies retention)",
                            "parallel.save_timeout_s", cfg_.parallel.save_timeout_s);
  last_checkpoint_ = writer.save(c, mine);
  const double total = seconds_since(t0);
  print("checkpoint: " + last_checkpoint_ + " (" + std::to_string(int(total * 1000)) + " ms) [" +
        save_phases(prepared, *reached, total) + "]");
  return last_checkpoint_;
}

void Trainer::poll_async_save(bool wait) {
  if (!pending_save_) return;
  AsyncCheckpointSave& s = *pending_save_;
  // Waiting, the phase covers the collectives below too: a rank done with its own write waits in them for a rank
  // whose write takes longer, under parallel.save_timeout_s, not parallel.timeout_s.
  std::optional<PhaseDeadline> phase;
  if (wait) {
    phase.emplace("waiting for the checkpoint save in flight", "parallel.save_timeout_s", cfg_.parallel.save_timeout_s);
    s.wait();
  }
  // Collective, the same number of calls on every rank: all done? any failed (the lowest failed rank, + 1)?
  const bool done = s.done();
  const bool failed = done && !s.error().empty();
  const bool all_done = comm_->all_reduce(done ? 0.0 : 1.0, ReduceOp::Max) == 0.0;
  const double failed_mark = comm_->all_reduce(failed ? double(world_ - rank_) : 0.0, ReduceOp::Max);
  if (failed_mark > 0) {
    const int r = world_ - int(failed_mark);
    const int64_t step = s.step();
    const std::string why = failed ? s.error() : "see rank " + std::to_string(r) + "'s message";
    s.wait();
    pending_save_.reset();
    throw std::runtime_error("checkpoint: the background save of step " + std::to_string(step) + " failed on rank " +
                             std::to_string(r) + ": " + why + "; its files stay in step-" + std::to_string(step) +
                             ".tmp, the last complete checkpoint is " +
                             (last_checkpoint_.empty() ? std::string("none") : last_checkpoint_));
  }
  if (!all_done) return;
  const auto t0 = Clock::now();
  last_checkpoint_ = rank_ == 0 ? s.commit() : s.final_dir();
  print("checkpoint: " + last_checkpoint_ + " (written in the background in " +
        std::to_string(int(s.write_seconds() * 1000)) + " ms, committed in " +
        std::to_string(int(seconds_since(t0) * 1000)) + " ms)");
  pending_save_.reset();
}

}  // namespace gmod

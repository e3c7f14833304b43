// Crash-safe, resumable training checkpoints in a run directory, independent of the optimizer implementation.
//
// Layout of <run>/checkpoints/step-<N>/ (a checkpoint counts only once renamed from step-<N>.tmp and with a manifest):
//   model.h5            rank 0: model parameters as /<gmod name> (bf16 as uint16 + dtype attr, fp32 as float);
//                       root attrs format_version, step, config (JSON), tensor_names (JSON list of all, stored
//                       order); in a checkpoint whose weights every rank wrote a share of, also own_tensor_names
//                       (those in this file) and parts (JSON list of the other files: model-rank-<r>.h5)
//   model-rank-<r>.h5   rank r >= 1: its share of the parameters (split_model_by_bytes); root attrs
//                       format_version, step, rank, tensor_names (those in this file)
//   optim-rank-<r>.h5   rank r: /tensors/<name> (the rank's ZeRO shard: master, exp_avg, exp_avg_sq, step, ...),
//                       /rng_state (uint8 CPU generator state), /cuda_rng_state (uint8 CUDA generator state of the
//                       rank's device; only when the run used CUDA); root attrs format_version, step, rank, world_size,
//                       shard_layout (JSON), meta (JSON), tensor_names (JSON list)
//   trainer-state.json  step, world_size, config, trainer_state (LR scheduler, counters), data_position, shard_layout
//   manifest.json       written last: format, step, world_size, job (the writing process, this_job_id()), per file
//                       {bytes, crc32}; its presence marks validity
//
// Save protocol (CheckpointWriter::save, collective): every rank writes its share of the model and its optim file
// into step-N.tmp/, fsyncs them and writes a side file with their sizes and CRC-32s (computed while writing: each
// tensor's bytes are checksummed once, only HDF5's metadata is read back); barrier; rank 0 removes stale *.tmp
// dirs and foreign files, checks the parts hold every tensor once, writes trainer-state.json, writes manifest.json
// (tmp + fsync + rename), fsyncs the directory, renames step-N.tmp -> step-N, fsyncs checkpoints/, prunes to
// keep_last; barrier. A crash at any point leaves the previous complete checkpoint. Asynchronous saves
// (AsyncCheckpointSave) run the first half on a background thread and the commit once every rank has finished.
//
// A checkpoint this process did not write is never deleted unless it verifies: retention deletes another job's
// checkpoint only after its CRCs check (a corrupt one is set aside as step-<N>.corrupt instead), and a save over an
// existing step-<N> of another job sets that one aside as step-<N>.superseded. Set-aside directories keep their
// contents, are not listed, resumed from, pruned or cleaned; the operator inspects or deletes them.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gmod {

inline constexpr int64_t kCheckpointFormatVersion = 1;

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// One rank's share of the optimizer state, as opaque named tensors plus JSON.
struct RankState {
  NamedTensors tensors;                            // e.g. master [P], exp_avg [P], exp_avg_sq [P], step []
  nlohmann::json meta = nlohmann::json::object();  // e.g. {"shard_begin": .., "shard_end": .., "padding": ..}
  std::vector<uint8_t> rng_state;                  // generator_state_bytes(CPU generator)
  // generator_state_bytes(the CUDA generator of the rank's device); empty for CPU runs (and checkpoints written
  // before it was saved: an absent dataset reads as empty).
  std::vector<uint8_t> cuda_rng_state;
  int rank = 0;                                    // filled in by the reader
  int world_size = 1;                              // filled in by the reader
  nlohmann::json shard_layout;                     // filled in by the reader (as saved with this file)
};

// Everything saved at one step. `model` is only used on rank 0.
struct CheckpointContent {
  int64_t step = 0;
  nlohmann::json config = nlohmann::json::object();         // effective run config
  nlohmann::json trainer_state = nlohmann::json::object();  // LR scheduler state, counters, ...
  nlohmann::json data_position = nlohmann::json::object();  // e.g. consumed samples, epoch, seed
  nlohmann::json shard_layout = nlohmann::json::object();   // [{name, shape, offset, numel}], total, padding, ...
  // The model weights this rank writes. Either every parameter by gmod name on rank 0 (model_names empty: model.h5
  // holds them all), or, with model_names set on every rank (all names, stored order), this rank's share of them
  // (split_model_by_bytes): each rank writes its own part, in parallel.
  NamedTensors model;
  std::vector<std::string> model_names;
};

// Which rank writes each model tensor, given their sizes in bytes: largest first onto the least loaded rank, so
// that every rank writes about the same amount. Deterministic (the same on every rank).
std::vector<int> split_model_by_bytes(const std::vector<int64_t>& bytes, int world_size);

// Points of the save protocol after which CheckpointOptions::on_stage is called (tests inject crashes there).
enum class SaveStage : int {
  kBegin = 0,               // nothing written yet
  kRankFileWritten,         // this rank's optim file and CRC side file are on disk
  kRanksSynced,             // after the first barrier (rank 0: stale *.tmp dirs removed)
  kModelWritten,            // rank 0: model.h5 (before its optim file, while the others write theirs)
  kTrainerStateWritten,     // rank 0: trainer-state.json
  kManifestWritten,         // rank 0: manifest.json in step-N.tmp/
  kRenamed,                 // rank 0: step-N.tmp renamed to step-N, parent fsynced
  kPruned,                  // rank 0: old checkpoints beyond keep_last deleted
};
inline constexpr int kNumSaveStages = 8;
const char* save_stage_name(SaveStage s);

struct CheckpointOptions {
  // Complete checkpoints to keep (the one just written included); >= 2, or 0 to keep all.
  int keep_last = 3;
  // Collective barrier over all ranks; required when world_size > 1. (In a single process the ranks may instead be
  // called one after another in order world_size-1 .. 0 with a no-op barrier.)
  std::function<void()> barrier;
  // Test hook, called on each rank after every stage it passes; throwing from it simulates a crash there.
  std::function<void(SaveStage)> on_stage;
  // Receives warnings (skipped checkpoints, cleanup failures); default prints "gmod: warning: ..." to stderr.
  std::function<void(const std::string&)> warn;
  // Who writes: stamped into the manifest; checkpoints of another job are not deleted unverified. "" = this_job_id().
  std::string job_id;
};

// This process's identity for checkpoint ownership: "<host>:<pid>:<start time ns>", fixed at the first call.
const std::string& this_job_id();

class CheckpointWriter {
 public:
  CheckpointWriter(std::string run_dir, int rank, int world_size, CheckpointOptions options = {});
  // Collective: every rank calls it with the same content.step (model/config/... are read on rank 0 only).
  // Returns the final directory <run>/checkpoints/step-<N>. Tensors may live on any device.
  std::string save(const CheckpointContent& content, const RankState& mine);
  // save() in its two halves, for asynchronous saves. write_files: this rank's files into step-N.tmp/, no
  // collective (it may run on a background thread). commit: rank 0 only, once every rank's write_files returned:
  // trainer state, manifest, rename into place, retention; returns the final directory.
  void write_files(const CheckpointContent& content, const RankState& mine);
  std::string commit(const CheckpointContent& content);
  // <run>/checkpoints/step-<step>
  std::string final_dir(int64_t step) const;

 private:
  void stage(SaveStage s);
  void sync();
  std::string run_dir_;
  int rank_;
  int world_size_;
  CheckpointOptions opt_;
};

// Reads one complete checkpoint directory. The constructor parses manifest.json and trainer-state.json; it does not
// checksum the files (call verify(), or pick the directory with CheckpointManager::find_latest_valid()).
class CheckpointReader {
 public:
  explicit CheckpointReader(std::string step_dir);

  const std::string& dir() const { return dir_; }
  int64_t step() const { return step_; }
  int world_size() const { return world_size_; }
  const nlohmann::json& manifest() const { return manifest_; }
  const nlohmann::json& config() const { return state_.at("config"); }
  const nlohmann::json& trainer_state() const { return state_.at("trainer_state"); }
  const nlohmann::json& data_position() const { return state_.at("data_position"); }
  const nlohmann::json& shard_layout() const { return state_.at("shard_layout"); }
  // Throws naming the file and what failed when a size or CRC-32 does not match the manifest.
  void verify(bool checksums = true) const;

  std::vector<std::string> model_tensor_names() const;  // in saved order
  at::Tensor read_model_tensor(const std::string& name) const;  // CPU, stored dtype
  NamedTensors read_model() const;
  // Copies saved tensors into existing ones (any device) under no-grad, checking shape and dtype. Every name in
  // `params` must be in the checkpoint; with `strict`, every saved name must also be in `params`. Errors name the
  // tensor and the file.
  void load_model_into(const NamedTensors& params, bool strict = true) const;
  // The same, collectively over `world_size` ranks: the weights are read once per job (each part file by rank
  // part % world_size) and broadcast to the others. Every rank calls it with the same params.
  struct ModelShare {
    int rank = 0;
    int world_size = 1;
    std::function<void(at::Tensor&, int root)> broadcast;  // empty: every tensor read by this rank
  };
  void load_model_into(const NamedTensors& params, bool strict, const ModelShare& share) const;
  // The files holding the weights: model.h5, then its parts (model-rank-<r>.h5) when the ranks wrote them.
  std::vector<std::string> model_files() const;

  // The caller has just checked every file's CRC against the manifest (CheckpointManager::verify_file): reads then
  // skip the per-tensor CRCs, whose bytes that check covered.
  void set_files_verified(bool verified) { files_verified_ = verified; }
  // Datasets of at least this many bytes are checked while read (verify_file_deferring_data leaves them out): every
  // dataset that large (weights, optimizer state) is read by some rank on resume; the smaller ones (generator
  // states, some of which only their own rank reads) are checked with the metadata, before loading.
  static constexpr uint64_t kDeferredCrcBytes = 64u << 10;
  // With a sink, a tensor whose CRC-32 does not match its `crc32` attribute is read anyway and its message appended
  // there instead of thrown, so that every rank finishes the collective load and the ranks then agree on the
  // verdict (Trainer::resume_if_requested). The resume's one pass: verify_file_deferring_data, then this.
  void collect_crc_failures(std::vector<std::string>* sink) { crc_failures_ = sink; }

  // One old rank's optim file. Tensors named in `into` are read into those tensors (same element count; e.g. the
  // optimizer's live buffers, so a same-world resume needs no temporaries) and returned as them.
  RankState read_rank_state(int rank, const std::map<std::string, at::Tensor>& into = {}) const;
  std::vector<RankState> read_all_rank_states() const;  // ranks 0..world_size()-1, for resharding

 private:
  std::string dir_;
  nlohmann::json manifest_, state_;
  int64_t step_ = 0;
  int world_size_ = 0;
  bool files_verified_ = false;
  std::vector<std::string>* crc_failures_ = nullptr;
};

struct CheckpointEntry {
  int64_t step;
  std::string path;  // <run>/checkpoints/step-<N>
};

class CheckpointManager {
 public:
  explicit CheckpointManager(std::string run_dir, std::function<void(const std::string&)> warn = nullptr);

  std::string checkpoints_dir() const;
  static std::string step_dir_name(int64_t step);  // "step-<N>"
  // Complete (renamed) checkpoint directories, newest first, without verification. *.tmp dirs are not listed.
  std::vector<CheckpointEntry> list() const;
  // For `--resume auto`: the newest checkpoint whose manifest exists and whose files verify (sizes, and CRC-32
  // when `checksums`). Every newer one that fails is reported through warn (path and reason) and passed over.
  std::optional<CheckpointEntry> find_latest_valid(bool checksums = true) const;
  // The same walk, also returning every newer one that failed and why (newest first).
  struct Scan {
    std::optional<CheckpointEntry> valid;
    std::vector<std::pair<CheckpointEntry, std::string>> failed;
  };
  Scan scan(bool checksums = true) const;
  // Renames a complete checkpoint directory to <path>.<why> (<path>.<why>.2, ... when taken) and fsyncs the parent,
  // so that it is kept but never listed, resumed from, pruned or overwritten. Returns the new path.
  std::string set_aside(const std::string& step_dir, const std::string& why) const;
  // The job id in step_dir's manifest ("" when missing or unreadable).
  static std::string writer_job(const std::string& step_dir);
  // "" when step_dir is a valid checkpoint, else what failed.
  static std::string verify(const std::string& step_dir, bool checksums = true);
  // The files a (structurally valid) checkpoint's manifest lists, in a fixed order, and the size + CRC check of one
  // of them ("" when it matches): for spreading the CRC work of a resume over the ranks.
  static std::vector<std::string> manifest_files(const std::string& step_dir);
  static std::string verify_file(const std::string& step_dir, const std::string& fname);
  // The same check with the data of an HDF5 file's large datasets (CheckpointReader::kDeferredCrcBytes and more)
  // taken at their stored `crc32` attributes: it reads HDF5's metadata and the small datasets only. It proves the
  // file intact provided each of those datasets matches its attribute, which the reader then checks as it reads
  // them (CheckpointReader::collect_crc_failures): a resume reads the weights once, not twice.
  static std::string verify_file_deferring_data(const std::string& step_dir, const std::string& fname);

  // Removes leftover *.tmp directories of steps <= up_to_step except `keep` (a directory name), and *.tmp names
  // that carry no step. Rank 0 only, inside a commit. A later step's *.tmp is left alone: with asynchronous saves
  // the other ranks may already be writing the next save while rank 0 commits this one (a crashed run's leftover at
  // a later step is written afresh when that step is saved, its foreign files removed by that commit).
  void remove_stale_tmp(int64_t up_to_step, const std::string& keep = "") const;
  // Deletes complete checkpoints with step <= newest_step beyond the newest keep_last of them (each is first
  // renamed to *.tmp so that a crash mid-delete leaves nothing that looks complete). One that `job_id` did not write
  // is deleted only when it verifies (CRC-32); a corrupt one is set aside as <dir>.corrupt with a warning. Returns
  // the deleted paths.
  std::vector<std::string> prune(int keep_last, int64_t newest_step, const std::string& job_id = this_job_id()) const;

 private:
  static std::string check_file(const std::filesystem::path& dir, const std::string& fname, const nlohmann::json& info,
                                bool checksums, bool defer_data = false);
  std::string run_dir_;
  std::function<void(const std::string&)> warn_;
};

// CPU generator state as bytes (at::CPUGeneratorImpl::get_state) and back; the restored generator continues the
// same random sequence.
std::vector<uint8_t> generator_state_bytes(at::Generator gen);
void set_generator_state_bytes(at::Generator gen, const std::vector<uint8_t>& state);

}  // namespace gmod

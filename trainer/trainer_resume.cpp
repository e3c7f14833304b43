// Trainer::choose_resume, resume_if_requested and its guard: which checkpoint to continue from (decided before any
// work; corrupt ones are kept, never started over), whether it belongs to this run's setup, and loading model,
// optimizer (resharded to this world size and stage), generators, data position and LR schedule from it.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>

#include "parallel/watchdog.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/trainer.h"

namespace gmod {

namespace fs = std::filesystem;
using json = nlohmann::json;

void Trainer::check_resume_compatible(const std::string& dir, const json& saved_cfg, const json& saved_state) const {
  // What decides which samples come next and what is being trained: a change silently breaks "no sample skipped or
  // repeated" (seed, data, grouping, batch) or continues another model's optimizer state (model parts).
  const json now = to_json(cfg_);
  std::vector<std::string> diffs;
  auto compare = [&](const std::string& key, const json& was, const json& is) {
    if (!was.is_null() && was != is) diffs.push_back(key + ": checkpoint " + was.dump() + ", now " + is.dump());
  };
  auto at = [](const json& j, const char* a, const char* b = nullptr) -> json {
    if (!j.contains(a)) return json();
    if (!b) return j[a];
    return j[a].is_object() && j[a].contains(b) ? j[a][b] : json();
  };
  compare("seed", at(saved_cfg, "seed"), now["seed"]);
  for (const char* k : {"train", "group_by_modality_length", "template", "max_len"})
    compare(std::string("data.") + k, at(saved_cfg, "data", k), now["data"][k]);
  compare("batch.micro_batch", at(saved_cfg, "batch", "micro_batch"), now["batch"]["micro_batch"]);
  compare("global batch", saved_state.value("global_batch", json()), json(global_batch_));
  compare("data.train records", saved_state.value("dataset_records", json()), json(int64_t(train_set_->size())));
  for (const char* k : {"path", "llm", "vision", "projector"})
    if (!at(saved_cfg, "model", k).is_null() || !now["model"][k].get<std::string>().empty())
      compare(std::string("model.") + k, at(saved_cfg, "model", k).is_null() ? json("") : at(saved_cfg, "model", k),
              now["model"][k]);
  if (diffs.empty()) return;
  std::string msg = "resume: " + dir + " belongs to another run setup (" + std::to_string(diffs.size()) + " change" +
                    (diffs.size() > 1 ? "s" : "") + "):";
  for (const auto& d : diffs) msg += "\n  " + d;
  if (!cfg_.resume_allow_changes)
    throw std::runtime_error(msg + "\nresuming would skip or repeat samples or continue another model; start a new "
                             "run_dir, or set resume_allow_changes=true to resume anyway");
  print("warning: " + msg + "\n(resume_allow_changes=true: resuming anyway)");
}

// Collective: the CRC check of one checkpoint spread over the ranks (file k of the manifest by rank k % world), so
// that a resume reads each file once in all instead of rank 0 reading everything while the others wait. Returns ""
// or what failed (rank 0 names the lowest failing file; the others get a placeholder).
std::string Trainer::verify_spread(const std::string& dir) {
  // resume=auto_or_scratch checks every byte before loading: were a tensor found bad while loading the last valid
  // candidate, the job would start from scratch over weights that hold part of it. Otherwise the large tensors'
  // CRCs are checked as they are read (one pass; CheckpointManager::verify_file_deferring_data).
  const bool defer_data = cfg_.resume != "auto_or_scratch";
  auto check = [&](const std::string& f) {
    return defer_data ? CheckpointManager::verify_file_deferring_data(dir, f) : CheckpointManager::verify_file(dir, f);
  };
  std::vector<std::string> files;
  try {
    files = CheckpointManager::manifest_files(dir);
  } catch (const std::exception&) {
    // Unreadable here: counted as a failure of file 0 below (rank 0 names it).
  }
  int64_t first_bad = int64_t(files.size()) + 1;
  if (files.empty()) first_bad = 0;
  for (size_t k = size_t(rank_); k < files.size(); k += size_t(world_))
    if (!check(files[k]).empty()) {
      first_bad = int64_t(k);
      break;
    }
  const int64_t n = int64_t(files.size()) + 1;
  const int64_t bad = n - int64_t(comm_->all_reduce(double(n - first_bad), ReduceOp::Max));
  if (bad >= n) return "";
  if (rank_ != 0) return "a file failed its check";
  if (files.empty()) return CheckpointManager::verify(dir, false);
  const std::string why = check(files[size_t(bad)]);
  return why.empty() ? files[size_t(bad)] + " failed its check on another rank" : why;
}

void Trainer::choose_resume() {
  resume_dir_.clear();
  if (cfg_.resume == "none") return;
  struct Timer {  // resume_verify_s_ = this call's time, whichever way it returns
    double& out;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    ~Timer() { out = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
  } timer{resume_verify_s_};
  // Every file's CRC is read once (~95 GB at 7B), spread over the ranks: a phase with its own deadline.
  const PhaseDeadline phase("checkpoint verification on resume (the ranks check the files' CRCs)",
                            "parallel.resume_check_timeout_s", cfg_.parallel.resume_check_timeout_s);
  auto broadcast_int = [&](int64_t v) {
    at::Tensor t = at::full({1}, double(v), at::TensorOptions().dtype(at::kDouble).device(device_));
    comm_->broadcast(t, 0);
    return int64_t(t.item<double>());
  };
  if (!resume_is_auto()) {
    std::string why = rank_ == 0 ? CheckpointManager::verify(cfg_.resume, /*checksums=*/false) : "";
    if (broadcast_int(why.empty() ? 0 : 1) == 0) why = verify_spread(cfg_.resume);
    if (rank_ == 0 && !why.empty())
      throw std::runtime_error("resume: checkpoint " + cfg_.resume + " is not valid: " + why);
    comm_->barrier();  // the others wait for the verdict here, under the phase's deadline
    resume_dir_ = cfg_.resume;
    return;
  }
  // Rank 0 walks the checkpoints newest first (manifests and sizes); each candidate's CRCs are checked by all
  // ranks together; the first that passes is loaded by every rank. A refusal throws on rank 0 only, which ends the
  // job (the others wait in the broadcast).
  CheckpointManager mgr(cfg_.run_dir, [this](const std::string& w) { print("warning: " + w); });
  std::vector<CheckpointEntry> all = rank_ == 0 ? mgr.list() : std::vector<CheckpointEntry>{};
  std::vector<std::pair<CheckpointEntry, std::string>> failed;
  int64_t found = -1;
  for (size_t k = 0;; ++k) {
    // Rank 0: the next structurally valid candidate (-1: none left).
    int64_t step = -1;
    if (rank_ == 0)
      for (; k < all.size(); ++k) {
        const std::string why = CheckpointManager::verify(all[k].path, /*checksums=*/false);
        if (why.empty()) {
          step = all[k].step;
          break;
        }
        print("warning: checkpoint " + all[k].path + " skipped: " + why);
        failed.emplace_back(all[k], why);
      }
    step = broadcast_int(step);
    if (step < 0) break;
    const std::string dir =
        (fs::path(mgr.checkpoints_dir()) / CheckpointManager::step_dir_name(step)).string();
    // A checkpoint whose tensors failed their CRCs while an earlier attempt loaded it (resume_if_requested) is
    // passed over like one that fails here.
    const auto bad_on_load = corrupt_on_load_.find(dir);
    const std::string why = bad_on_load != corrupt_on_load_.end() ? bad_on_load->second : verify_spread(dir);
    if (why.empty()) {
      found = step;
      break;
    }
    if (rank_ == 0) {
      print("warning: checkpoint " + dir + " skipped: " + why);
      failed.emplace_back(all[k], why);
    }
  }
  if (rank_ == 0) {
    if (found < 0 && !failed.empty() && cfg_.resume == "auto") {
      std::string msg = "resume: auto: " + mgr.checkpoints_dir() + " has " + std::to_string(failed.size()) +
                        " checkpoint(s) and none is valid:";
      for (const auto& [e, why] : failed) msg += "\n  " + e.path + ": " + why;
      throw std::runtime_error(msg + "\nrefusing to start from scratch (that would train over them); repair or move "
                               "them, resume from one explicitly (resume=<step dir>), or set "
                               "resume=auto_or_scratch to start from scratch and keep them as step-<N>.corrupt");
    }
    // Newer than the one resumed from (or all, from scratch): kept under another name, out of the way of this
    // run's saves and retention.
    for (const auto& [e, why] : failed)
      print("resume: " + e.path + " is not valid (" + why + "); kept as " + mgr.set_aside(e.path, "corrupt"));
  }
  found = broadcast_int(found);
  if (found >= 0)
    resume_dir_ = (fs::path(mgr.checkpoints_dir()) / CheckpointManager::step_dir_name(found)).string();
}

void Trainer::resume_if_requested() {
  // A tensor that fails its CRC while read: this checkpoint is passed over as the check before loading would have
  // (resume=auto: the next older valid one is chosen and loaded over what was read; every parameter and state
  // buffer is overwritten), or named (resume=<dir>).
  for (std::string why; !(why = load_resume_dir()).empty();) {
    if (!resume_is_auto())
      throw std::runtime_error("resume: checkpoint " + resume_dir_ + " is not valid: " + why);
    const std::string bad = resume_dir_;
    corrupt_on_load_[bad] = why;
    choose_resume();
    // Nothing valid left: resume=auto refuses inside choose_resume; resume=auto_or_scratch checked every byte before
    // loading (verify_spread), so only a file changed since then gets here.
    if (resume_dir_.empty())
      throw std::runtime_error("resume: " + cfg_.run_dir + "/checkpoints has no valid checkpoint left (" + bad +
                               " failed while loading: " + why + "; it is kept as .corrupt); the weights hold part of "
                               "it, start the job again to train from scratch");
  }
}

std::string Trainer::load_resume_dir() {
  if (resume_dir_.empty()) {
    if (resume_is_auto())
      print("resume: no valid checkpoint in " + cfg_.run_dir + "/checkpoints, starting from scratch");
    return "";
  }
  const std::string dir = resume_dir_;
  const auto t0 = std::chrono::steady_clock::now();
  auto ms = [](std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
    return int(std::chrono::duration<double>(b - a).count() * 1000);
  };
  CheckpointReader reader(dir);
  // choose_resume checked each file's CRC with the large datasets at their stored CRCs (verify_spread); those are
  // checked here, in the pass that reads them, and the ranks agree on the verdict after the last read.
  std::vector<std::string> crc_failures;
  reader.collect_crc_failures(&crc_failures);
  const int saved_world = reader.world_size();
  const json& saved_cfg = reader.config();
  check_resume_compatible(dir, saved_cfg, reader.trainer_state());
  if (saved_cfg.contains("mod") && saved_cfg["mod"].value("enabled", false) != cfg_.mod.enabled)
    throw std::runtime_error("resume: " + dir + " was trained with mod.enabled = " +
                             (cfg_.mod.enabled ? "false" : "true") + "; the config says otherwise");
  if (cfg_.mod.enabled && saved_cfg.contains("mod") && saved_cfg["mod"].contains("config")) {
    // Same parameter names whichever layers are MoD, so a different conversion would load silently.
    const json saved_mod = saved_cfg["mod"]["config"], now_mod = to_json(cfg_.mod.config);
    for (const char* key : {"mod_layers_idx", "router"})
      if (saved_mod.value(key, json()) != now_mod.value(key, json()))
        throw std::runtime_error("resume: " + dir + " was trained with mod " + key + " = " +
                                 saved_mod.value(key, json()).dump() + " but this run converts to " +
                                 now_mod.value(key, json()).dump() +
                                 " (set mod.config.mod_layers to the checkpoint's layers, or start a new run_dir)");
  }

  // Model weights (all parameters, frozen ones included).
  dp_->with_full_params([&] {  // ZeRO-3: into the gathered units (the trainable ones are then set from the master)
    NamedTensors params;
    for (auto& item : model_->named_parameters()) params.emplace_back(item.key(), item.value());
    // Every rank reads every weight from the files itself: the ranks of a node read them from the page cache at
    // memory speed, in parallel, where one reader broadcasting each tensor over MPI cost more than the read (issue
    // 47). Each rank checks the CRCs of what it reads; the ranks agree on the verdict below.
    reader.load_model_into(params, /*strict=*/true);
  });
  const auto t_weights = std::chrono::steady_clock::now();

  // Optimizer state: read only the old ranks whose ranges overlap the one this rank needs.
  const json& sl = reader.shard_layout();
  const FlatParamLayout saved_layout = FlatParamLayout::from_json(sl.at("layout"));
  const int saved_stage = sl.at("stage").get<int>();
  if (!saved_layout.same_params(dp_->layout()))
    throw std::runtime_error("resume: the trainable parameters of " + dir +
                             " differ from this run's (changed freeze, optimizer.groups freeze or mod settings?)");
  // The format of the live state (ZeRO-3's is a stage-2 one, the same shard range: it loads what stage 2 would).
  const int stage = dp_->state_stage();
  const std::vector<int> old_ranks =
      saved_state_ranks(saved_layout, saved_stage, saved_world, dp_->state_range(rank_));
  // Same world, stage and range: this rank's file is read straight into the live optimizer buffers (no
  // temporaries: resume needs no more host memory than training). Otherwise the overlapping old shards are read and
  // resharded.
  const bool in_place = saved_world == world_ && saved_stage == stage && old_ranks == std::vector<int>{rank_};
  std::map<std::string, at::Tensor> live;
  if (in_place) {
    const AdamWShardState now = dp_->state_dict();  // aliases of the live buffers
    live = {{"master", now.master}, {"exp_avg", now.exp_avg}, {"exp_avg_sq", now.exp_avg_sq}};
  }
  std::vector<AdamWShardState> saved;
  std::vector<uint8_t> my_rng, my_cuda_rng;
  for (int r : old_ranks) {
    RankState rs = reader.read_rank_state(r, live);
    AdamWShardState s = AdamWShardState::from_meta(rs.meta);
    for (auto& [name, t] : rs.tensors) {
      if (name == "master") s.master = t;
      else if (name == "exp_avg") s.exp_avg = t;
      else if (name == "exp_avg_sq") s.exp_avg_sq = t;
    }
    if (!s.master.defined() || !s.exp_avg.defined() || !s.exp_avg_sq.defined())
      throw std::runtime_error("resume: " + dir + ": optimizer file of rank " + std::to_string(r) +
                               " lacks master/exp_avg/exp_avg_sq");
    if (r == rank_) my_rng = rs.rng_state, my_cuda_rng = rs.cuda_rng_state;
    saved.push_back(std::move(s));
  }
  const auto t_optim = std::chrono::steady_clock::now();
  if (saved_world == world_ && saved_stage == stage && saved.size() == 1 && saved[0].rank == rank_) {
    dp_->load_state_dict(saved[0]);
  } else {
    dp_->load_state_dict(reshard_state(saved, world_, rank_, stage));
  }

  // Generators: each rank's own state at the same world size, else a fresh deterministic seed.
  step_ = reader.step();
  if (saved_world == world_) {
    if (my_rng.empty()) {
      RankState rs = reader.read_rank_state(rank_);
      my_rng = rs.rng_state;
      my_cuda_rng = rs.cuda_rng_state;
    }
    set_generator_state_bytes(at::detail::getDefaultCPUGenerator(), my_rng);
    // CUDA runs: the device generator too (dropout, sampling on the GPU); absent in CPU runs and older checkpoints.
    if (device_.is_cuda() && !my_cuda_rng.empty())
      set_generator_state_bytes(at::globalContext().defaultGenerator(device_), my_cuda_rng);
  } else {
    at::manual_seed(rank_seed(cfg_.seed, step_, rank_));
  }
  // The verdict: the lowest rank that saw a bad tensor (each failing rank names its own).
  for (const auto& f : crc_failures) std::cerr << "resume: rank " << rank_ << ": " << f << std::endl;
  const int first_bad =
      int(-comm_->all_reduce(-double(crc_failures.empty() ? world_ : rank_), ReduceOp::Max));
  if (first_bad < world_)
    return (rank_ == first_bad ? crc_failures.front() : "a tensor failed its CRC-32 on rank " + std::to_string(first_bad)) +
           " (while loading)";

  const json& ts = reader.trainer_state();
  skipped_total_ = ts.value("skipped_total", int64_t(0));
  // optimizer.groups: the moments are per element, whatever group an element is in, so changed learning rates or
  // weight decays apply from the next step (as a changed LR schedule does), with a warning naming them. A changed
  // freeze changes the trainable set and was refused above.
  const json saved_groups = ts.value("param_groups", json());
  const std::string group_diff = saved_groups.is_null()
                                     ? (param_groups_.grouped() ? "\n  the checkpoint has no groups (saved without them)" : "")
                                     : describe_group_changes(saved_groups, param_groups_);
  if (!group_diff.empty())
    print("warning: optimizer.groups changed on resume from " + dir + "; the new settings apply from step " +
          std::to_string(reader.step() + 1) + ":" + group_diff);
  start_position_ = data_position_from_json(reader.data_position());
  const int64_t saved_global = ts.value("global_batch", global_batch_);
  if (start_position_.consumed_samples % (int64_t(world_) * cfg_.batch.micro_batch) != 0)
    throw std::runtime_error("resume: " + dir + " stopped after " + std::to_string(start_position_.consumed_samples) +
                             " samples of epoch " + std::to_string(start_position_.epoch) +
                             ", not a multiple of world size x micro_batch = " +
                             std::to_string(world_ * cfg_.batch.micro_batch) + "; choose a compatible world size");
  // The schedule's horizon is only known once the loader exists; the constructor restores it from this.
  saved_schedule_ = ts.at("lr_schedule");
  if (resume_is_auto()) {  // the checkpoint belongs to this run: no need to save the same step again
    last_saved_step_ = step_;
    last_checkpoint_ = dir;
  }
  print("resume: " + dir + " (step " + std::to_string(step_) + ", saved by " + std::to_string(saved_world) +
        " rank(s), ZeRO-" + std::to_string(saved_stage) + ") -> " + std::to_string(world_) + " rank(s), ZeRO-" +
        std::to_string(cfg_.optimizer.zero_stage) + "; data epoch " + std::to_string(start_position_.epoch) + " sample " +
        std::to_string(start_position_.consumed_samples) +
        (saved_global != global_batch_ ? "; global batch changed from " + std::to_string(saved_global) : "") +
        "; files checked in " + std::to_string(int(resume_verify_s_ * 1000)) +
        " ms, state read and its tensors' CRCs checked in " + std::to_string(ms(t0, std::chrono::steady_clock::now())) +
        " ms (weights " + std::to_string(ms(t0, t_weights)) + " ms, optimizer state " +
        std::to_string(ms(t_weights, t_optim)) + " ms)");
  return "";
}

}  // namespace gmod

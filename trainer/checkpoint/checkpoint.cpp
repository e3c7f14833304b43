// Checkpoint save protocol and retention; see checkpoint.h for the layout (reading: checkpoint_reader.cpp,
// verification: checkpoint_verify.cpp).
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/checkpoint_files.h"

#include "trainer/checkpoint/file_crc.h"
#include "trainer/checkpoint/hdf5_file.h"

#include <ATen/core/grad_mode.h>

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>

namespace gmod {
namespace fs = std::filesystem;
using nlohmann::json;
using namespace checkpoint_files;

namespace {


std::string errno_msg() { return std::strerror(errno); }

// Deletes a file or directory tree; true when nothing is left. nftw, not std::filesystem's tree removal: the torch
// wheel's libtorch.so exports a crashing copy of the std::filesystem symbols (docs/engineering.md).
bool remove_tree(const fs::path& p) {
  struct stat st;
  if (::lstat(p.c_str(), &st) != 0) return errno == ENOENT;
  nftw(p.c_str(), [](const char* q, const struct stat*, int, struct FTW*) { return ::remove(q); }, 16,
       FTW_DEPTH | FTW_PHYS);
  return ::lstat(p.c_str(), &st) != 0;
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw std::runtime_error("checkpoint: cannot open " + path + " to fsync: " + errno_msg());
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw std::runtime_error("checkpoint: fsync of " + path + " failed: " + std::strerror(err));
}

// Writes `text` to `path` (truncating) and fsyncs it.
void write_file_synced(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error("checkpoint: cannot create " + path + ": " + errno_msg());
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      throw std::runtime_error("checkpoint: write to " + path + " failed: " + std::strerror(err));
    }
    p += n;
    left -= size_t(n);
  }
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw std::runtime_error("checkpoint: fsync of " + path + " failed: " + std::strerror(err));
}

void rename_or_throw(const fs::path& from, const fs::path& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0)
    throw std::runtime_error("checkpoint: rename " + from.string() + " -> " + to.string() + " failed: " + errno_msg());
}

void check_names(const NamedTensors& ts, const std::string& what) {
  std::set<std::string> seen;
  for (const auto& [name, t] : ts) {
    if (name.empty()) throw std::invalid_argument("checkpoint: empty tensor name in " + what);
    if (!seen.insert(name).second) throw std::invalid_argument("checkpoint: duplicate tensor '" + name + "' in " + what);
    if (!t.defined()) throw std::invalid_argument("checkpoint: undefined tensor '" + name + "' in " + what);
  }
}

json names_of(const NamedTensors& ts) {
  json j = json::array();
  for (const auto& [name, t] : ts) j.push_back(name);
  return j;
}

// {bytes, crc32} of one file.
json file_sum(const std::string& path) {
  uint64_t bytes = 0;
  uint32_t crc = crc32_file(path, &bytes);
  return json{{"bytes", bytes}, {"crc32", hex32(crc)}};
}

void default_warn(const std::string& msg) { std::cerr << "gmod: warning: " << msg << std::endl; }

}  // namespace

const std::string& this_job_id() {
  static const std::string id = [] {
    char host[256] = {0};
    if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    return std::string(host) + ":" + std::to_string(::getpid()) + ":" +
           std::to_string(int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec);
  }();
  return id;
}

const char* save_stage_name(SaveStage s) {
  switch (s) {
    case SaveStage::kBegin: return "begin";
    case SaveStage::kRankFileWritten: return "rank-file-written";
    case SaveStage::kRanksSynced: return "ranks-synced";
    case SaveStage::kModelWritten: return "model-written";
    case SaveStage::kTrainerStateWritten: return "trainer-state-written";
    case SaveStage::kManifestWritten: return "manifest-written";
    case SaveStage::kRenamed: return "renamed";
    case SaveStage::kPruned: return "pruned";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------------- writer

CheckpointWriter::CheckpointWriter(std::string run_dir, int rank, int world_size, CheckpointOptions options)
    : run_dir_(std::move(run_dir)), rank_(rank), world_size_(world_size), opt_(std::move(options)) {
  if (world_size_ < 1 || rank_ < 0 || rank_ >= world_size_)
    throw std::invalid_argument("checkpoint: bad rank " + std::to_string(rank_) + " of world size " +
                                std::to_string(world_size_));
  if (opt_.keep_last != 0 && opt_.keep_last < 2)
    throw std::invalid_argument("checkpoint: keep_last must be 0 (keep all) or >= 2, got " +
                                std::to_string(opt_.keep_last) + " (the newest may be mid-save when a crash hits)");
  if (world_size_ > 1 && !opt_.barrier)
    throw std::invalid_argument("checkpoint: a barrier callback is required for world size > 1");
  if (!opt_.warn) opt_.warn = default_warn;
  if (opt_.job_id.empty()) opt_.job_id = this_job_id();
}

void CheckpointWriter::stage(SaveStage s) {
  if (opt_.on_stage) opt_.on_stage(s);
}

void CheckpointWriter::sync() {
  if (opt_.barrier) opt_.barrier();
}

std::vector<int> split_model_by_bytes(const std::vector<int64_t>& bytes, int world_size) {
  if (world_size < 1) throw std::invalid_argument("checkpoint: split_model_by_bytes: world size < 1");
  // Largest first onto the least loaded rank (ties: the lower rank), so every rank writes about total / world.
  std::vector<size_t> order(bytes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bytes[a] > bytes[b]; });
  std::vector<int64_t> load(size_t(world_size), 0);
  std::vector<int> owner(bytes.size(), 0);
  for (size_t i : order) {
    const int r = int(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = r;
    load[size_t(r)] += bytes[i];
  }
  return owner;
}

namespace {

// Writes one HDF5 file of tensors under `group` ("" = the root) and fsyncs it; returns {bytes, crc32}, the CRC
// taken from the tensors' own (computed once, while writing) plus a read of the file's metadata. Tensors of 1 MiB
// and more go to disk with O_DIRECT (H5File::create's direct_data): a buffered write + fsync of gigabytes runs at
// the page cache's writeback speed (issue 47).
template <typename Attrs>
json write_tensor_file(const std::string& path, const NamedTensors& tensors, const std::string& group, Attrs&& attrs) {
  H5File f = H5File::create(path, /*direct_data=*/true);
  attrs(f);
  if (!group.empty()) f.create_group(group);
  for (const auto& [tname, t] : tensors) f.write_tensor(group.empty() ? tname : group + "/" + tname, t);
  const std::vector<KnownCrcRegion> known = f.written_regions();
  f.close();
  fsync_path(path, false);
  uint64_t bytes = 0;
  const uint32_t crc = crc32_file_with_known(path, known, &bytes);
  return json{{"bytes", bytes}, {"crc32", hex32(crc)}};
}

// Rank 0 at commit: the parts together hold every name of model_names exactly once (read from their metadata).
void check_model_parts(const std::string& dir, const std::vector<std::string>& model_names) {
  std::map<std::string, std::string> where;
  for (const auto& [file, names] : model_part_index(dir))
    for (const auto& n : names)
      if (!where.emplace(n, file).second)
        throw std::runtime_error("checkpoint: tensor '" + n + "' is in both " + where[n] + " and " + file + " of " + dir);
  for (const auto& n : model_names)
    if (!where.count(n))
      throw std::runtime_error("checkpoint: no rank wrote model tensor '" + n + "' into " + dir);
  if (where.size() != model_names.size())
    throw std::runtime_error("checkpoint: the model parts in " + dir + " hold " + std::to_string(where.size()) +
                             " tensors, model.h5 lists " + std::to_string(model_names.size()));
}

}  // namespace

void CheckpointWriter::write_files(const CheckpointContent& c, const RankState& mine) {
  if (c.step < 0) throw std::invalid_argument("checkpoint: negative step " + std::to_string(c.step));
  const fs::path tmp = fs::path(CheckpointManager(run_dir_, opt_.warn).checkpoints_dir()) /
                       (CheckpointManager::step_dir_name(c.step) + ".tmp");
  stage(SaveStage::kBegin);
  // Every rank: its part of the model weights (rank 0: model.h5 with the index of all of them; the others
  // model-rank-<r>.h5), then its optimizer shard, RNG state and layout; the sums of both go into a side file that
  // rank 0 reads for the manifest. With c.model_names empty (callers that give rank 0 every tensor), model.h5 holds
  // them all.
  check_names(mine.tensors, optim_file(rank_));
  const bool split = !c.model_names.empty();
  if (split || rank_ == 0) check_names(c.model, rank_ == 0 ? kModelFile : model_part_file(rank_));
  if (split) {
    const std::set<std::string> all(c.model_names.begin(), c.model_names.end());
    if (all.size() != c.model_names.size())
      throw std::invalid_argument("checkpoint: duplicate name in model_names");
    for (const auto& [n, t] : c.model)
      if (!all.count(n)) throw std::invalid_argument("checkpoint: tensor '" + n + "' is not in model_names");
  }
  fs::create_directories(tmp);
  json sums = json::object();
  // A crashed earlier attempt at this step may have left any file in tmp: each one is written afresh.
  if (rank_ == 0) {
    sums[kModelFile] = write_tensor_file((tmp / kModelFile).string(), c.model, "", [&](H5File& f) {
      f.set_attr("/", "format_version", kCheckpointFormatVersion);
      f.set_attr("/", "step", c.step);
      f.set_json_attr("/", "config", c.config);
      f.set_json_attr("/", "tensor_names", split ? json(c.model_names) : names_of(c.model));
      if (split && world_size_ > 1) {
        f.set_json_attr("/", "own_tensor_names", names_of(c.model));
        json parts = json::array();
        for (int r = 1; r < world_size_; ++r) parts.push_back(model_part_file(r));
        f.set_json_attr("/", "parts", parts);
      }
    });
    stage(SaveStage::kModelWritten);
  } else if (split) {
    sums[model_part_file(rank_)] = write_tensor_file((tmp / model_part_file(rank_)).string(), c.model, "",
                                                     [&](H5File& f) {
                                                       f.set_attr("/", "format_version", kCheckpointFormatVersion);
                                                       f.set_attr("/", "step", c.step);
                                                       f.set_attr("/", "rank", int64_t(rank_));
                                                       f.set_json_attr("/", "tensor_names", names_of(c.model));
                                                     });
  }
  NamedTensors extra;
  at::Tensor rng = at::empty({int64_t(mine.rng_state.size())}, at::kByte);
  if (!mine.rng_state.empty()) std::memcpy(rng.data_ptr(), mine.rng_state.data(), mine.rng_state.size());
  sums[optim_file(rank_)] =
      write_tensor_file((tmp / optim_file(rank_)).string(), mine.tensors, "tensors", [&](H5File& f) {
        f.set_attr("/", "format_version", kCheckpointFormatVersion);
        f.set_attr("/", "step", c.step);
        f.set_attr("/", "rank", int64_t(rank_));
        f.set_attr("/", "world_size", int64_t(world_size_));
        f.set_json_attr("/", "shard_layout", c.shard_layout);
        f.set_json_attr("/", "meta", mine.meta);
        f.set_json_attr("/", "tensor_names", names_of(mine.tensors));
        f.write_tensor("rng_state", rng);
        if (!mine.cuda_rng_state.empty()) {
          at::Tensor crng = at::empty({int64_t(mine.cuda_rng_state.size())}, at::kByte);
          std::memcpy(crng.data_ptr(), mine.cuda_rng_state.data(), mine.cuda_rng_state.size());
          f.write_tensor("cuda_rng_state", crng);
        }
      });
  write_file_synced((tmp / sum_file(rank_)).string(), json{{"files", sums}}.dump());
  stage(SaveStage::kRankFileWritten);
}

std::string CheckpointWriter::save(const CheckpointContent& c, const RankState& mine) {
  write_files(c, mine);
  sync();
  std::string dir;
  if (rank_ == 0) dir = commit(c);
  sync();
  return rank_ == 0 ? dir : final_dir(c.step);
}

std::string CheckpointWriter::final_dir(int64_t step) const {
  return (fs::path(CheckpointManager(run_dir_).checkpoints_dir()) / CheckpointManager::step_dir_name(step)).string();
}

std::string CheckpointWriter::commit(const CheckpointContent& c) {
  if (rank_ != 0) throw std::logic_error("checkpoint: commit runs on rank 0");
  CheckpointManager mgr(run_dir_, opt_.warn);
  const fs::path root = mgr.checkpoints_dir();
  const std::string name = CheckpointManager::step_dir_name(c.step);
  const fs::path tmp = root / (name + ".tmp");
  const fs::path final_dir = root / name;
  mgr.remove_stale_tmp(c.step, tmp.filename().string());
  stage(SaveStage::kRanksSynced);

  // Every rank's side file: the sums of the files it wrote, each checked against the file's size on disk.
  json files = json::object();
  const bool split = !c.model_names.empty() && world_size_ > 1;
  for (int r = 0; r < world_size_; ++r) {
    const fs::path sp = tmp / sum_file(r);
    const json s = read_json_file(sp.string());
    for (const auto& [fname, sum] : s.at("files").items()) {
      uint64_t size = fs::file_size(tmp / fname);
      if (sum.at("bytes").get<uint64_t>() != size)
        throw std::runtime_error("checkpoint: " + (tmp / fname).string() + " has " + std::to_string(size) +
                                 " bytes but its rank recorded " + sum.at("bytes").dump());
      files[fname] = sum;
    }
  }
  if (split) check_model_parts(tmp.string(), c.model_names);

  // Anything not written by this save (a crashed earlier attempt at this step, another world size) goes.
  std::set<std::string> expected{kModelFile};
  for (int r = 0; r < world_size_; ++r) expected.insert({optim_file(r), sum_file(r), model_part_file(r)});
  std::vector<fs::path> foreign;
  for (const auto& e : fs::directory_iterator(tmp))
    if (!expected.count(e.path().filename().string())) foreign.push_back(e.path());
  for (const auto& p : foreign)
    if (!remove_tree(p)) throw std::runtime_error("checkpoint: cannot remove stale " + p.string());

  // Trainer state.
  json state{{"format_version", kCheckpointFormatVersion}, {"step", c.step},
             {"world_size", world_size_},           {"config", c.config},
             {"trainer_state", c.trainer_state},   {"data_position", c.data_position},
             {"shard_layout", c.shard_layout}};
  write_file_synced((tmp / kStateFile).string(), state.dump(1));
  stage(SaveStage::kTrainerStateWritten);

  // Manifest with every file's size and CRC-32, written last.
  files[kStateFile] = file_sum((tmp / kStateFile).string());
  for (int r = 0; r < world_size_; ++r) ::unlink((tmp / sum_file(r)).c_str());
  json manifest{{"format", kFormat},      {"format_version", kCheckpointFormatVersion},
                {"step", c.step},         {"world_size", world_size_},
                {"job", opt_.job_id},     {"checksum", "crc32"},
                {"files", files}};
  const fs::path mtmp = tmp / (std::string(kManifest) + ".partial");
  write_file_synced(mtmp.string(), manifest.dump(1));
  rename_or_throw(mtmp, tmp / kManifest);
  fsync_path(tmp.string(), true);
  stage(SaveStage::kManifestWritten);

  // Commit: atomic rename into place. An existing step-N is moved aside first: deleted after the rename when
  // this job wrote it (a re-save of the same step), else kept as step-N.superseded.
  fs::path replaced;
  if (fs::exists(final_dir)) {
    if (CheckpointManager::writer_job(final_dir.string()) == opt_.job_id) {
      replaced = root / (name + ".replaced.tmp");
      remove_tree(replaced);
      rename_or_throw(final_dir, replaced);
    } else {
      const std::string kept = mgr.set_aside(final_dir.string(), "superseded");
      opt_.warn("checkpoint " + final_dir.string() + " was written by another job; kept as " + kept +
                " (this run saves its own step " + std::to_string(c.step) + ")");
    }
  }
  rename_or_throw(tmp, final_dir);
  fsync_path(root.string(), true);
  if (!replaced.empty() && !remove_tree(replaced)) opt_.warn("cannot remove " + replaced.string());
  stage(SaveStage::kRenamed);

  // Retention.
  if (opt_.keep_last > 0) mgr.prune(opt_.keep_last, c.step, opt_.job_id);
  stage(SaveStage::kPruned);
  return final_dir.string();
}

// ---------------------------------------------------------------------------------------------------- manager

CheckpointManager::CheckpointManager(std::string run_dir, std::function<void(const std::string&)> warn)
    : run_dir_(std::move(run_dir)), warn_(warn ? std::move(warn) : default_warn) {}

std::string CheckpointManager::checkpoints_dir() const { return (fs::path(run_dir_) / "checkpoints").string(); }

std::string CheckpointManager::step_dir_name(int64_t step) { return "step-" + std::to_string(step); }

std::vector<CheckpointEntry> CheckpointManager::list() const {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  fs::directory_iterator it(checkpoints_dir(), ec), end;
  if (ec) return out;  // no checkpoints yet
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    if (!it->is_directory(ec)) continue;
    int64_t step = parse_step_dir(it->path().filename().string());
    if (step >= 0) out.push_back({step, it->path().string()});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step > b.step; });
  return out;
}

CheckpointManager::Scan CheckpointManager::scan(bool checksums) const {
  Scan out;
  for (const auto& e : list()) {
    std::string why = verify(e.path, checksums);
    if (why.empty()) {
      out.valid = e;
      break;
    }
    warn_("checkpoint " + e.path + " skipped: " + why);
    out.failed.emplace_back(e, why);
  }
  return out;
}

std::optional<CheckpointEntry> CheckpointManager::find_latest_valid(bool checksums) const {
  return scan(checksums).valid;
}

std::string CheckpointManager::set_aside(const std::string& step_dir, const std::string& why) const {
  std::string target = step_dir + "." + why;
  struct stat st;
  for (int k = 2; ::lstat(target.c_str(), &st) == 0; ++k) target = step_dir + "." + why + "." + std::to_string(k);
  rename_or_throw(step_dir, target);
  fsync_path(fs::path(step_dir).parent_path().string(), true);
  return target;
}

std::string CheckpointManager::writer_job(const std::string& step_dir) {
  try {
    const json m = read_json_file((fs::path(step_dir) / kManifest).string());
    return m.value("job", std::string());
  } catch (const std::exception&) {
    return "";
  }
}

void CheckpointManager::remove_stale_tmp(int64_t up_to_step, const std::string& keep) const {
  std::error_code ec;
  fs::directory_iterator it(checkpoints_dir(), ec), end;
  if (ec) return;
  std::vector<fs::path> stale;
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    const std::string n = it->path().filename().string();
    if (n.size() <= 4 || n.compare(n.size() - 4, 4, ".tmp") != 0 || n == keep) continue;
    // step-<K>.tmp, step-<K>.deleting.tmp, step-<K>.replaced.tmp: K read; anything else counts as stale.
    int64_t k = -1;
    if (n.rfind("step-", 0) == 0) {
      size_t i = 5;
      while (i < n.size() && std::isdigit(static_cast<unsigned char>(n[i]))) ++i;
      if (i > 5 && i - 5 < 19) k = std::stoll(n.substr(5, i - 5));
    }
    if (k <= up_to_step) stale.push_back(it->path());
  }
  for (const auto& p : stale)
    if (!remove_tree(p)) warn_("cannot remove leftover " + p.string());
}

std::vector<std::string> CheckpointManager::prune(int keep_last, int64_t newest_step, const std::string& job_id) const {
  if (keep_last < 2) throw std::invalid_argument("checkpoint: prune keep_last must be >= 2");
  std::vector<std::string> deleted;
  int kept = 0;
  for (const auto& e : list()) {
    if (e.step > newest_step) continue;  // from an abandoned later timeline: not ours to judge
    if (kept < keep_last) {
      ++kept;
      continue;
    }
    if (writer_job(e.path) != job_id) {
      // Another job's: deleted only when its manifest is complete and consistent, so that retention never destroys
      // what an operator may still want to recover (a save that never finished, a hand-edited directory). Its data
      // are not re-read: their CRCs were checked when they were written, and re-reading an old checkpoint inside a
      // save (the first one after every resume) costs a full read of it (~100 GB at 7B).
      const std::string why = verify(e.path, /*checksums=*/false);
      if (!why.empty()) {
        try {
          warn_("old checkpoint " + e.path + " fails verification (" + why + "); kept as " +
                set_aside(e.path, "corrupt") + " instead of being deleted");
        } catch (const std::exception& ex) {
          warn_("old checkpoint " + e.path + " fails verification (" + why + ") and is kept: " + ex.what());
        }
        continue;
      }
    }
    const fs::path doomed = fs::path(e.path).string() + ".deleting.tmp";
    remove_tree(doomed);
    if (std::rename(e.path.c_str(), doomed.c_str()) != 0) {
      warn_("cannot retire old checkpoint " + e.path + ": " + errno_msg());
      continue;
    }
    if (!remove_tree(doomed)) warn_("cannot remove " + doomed.string());
    deleted.push_back(e.path);
  }
  if (!deleted.empty()) fsync_path(checkpoints_dir(), true);
  return deleted;
}


}  // namespace gmod

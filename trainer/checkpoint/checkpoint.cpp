// Checkpoint save protocol, verification and retention; see checkpoint.h for the layout (reading:
// checkpoint_reader.cpp).
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/checkpoint_files.h"

#include "trainer/checkpoint/hdf5_file.h"

#include <ATen/core/grad_mode.h>

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
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

std::string hex32(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof(b), "%08x", v);
  return b;
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

// Parses "step-<digits>" exactly; -1 otherwise.
int64_t parse_step_dir(const std::string& name) {
  const std::string prefix = "step-";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return -1;
  std::string digits = name.substr(prefix.size());
  if (digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return std::stoll(digits);
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

std::string CheckpointWriter::save(const CheckpointContent& c, const RankState& mine) {
  if (c.step < 0) throw std::invalid_argument("checkpoint: negative step " + std::to_string(c.step));
  CheckpointManager mgr(run_dir_, opt_.warn);
  const fs::path root = mgr.checkpoints_dir();
  const std::string name = CheckpointManager::step_dir_name(c.step);
  const fs::path tmp = root / (name + ".tmp");
  const fs::path final_dir = root / name;
  stage(SaveStage::kBegin);

  // 1. Every rank: its optimizer shard, RNG state and layout index, then a CRC side file; rank 0 first writes the
  // model weights, so they are written while the other ranks write their shards (not after the barrier, with
  // every other rank waiting).
  check_names(mine.tensors, optim_file(rank_));
  if (rank_ == 0) check_names(c.model, kModelFile);
  fs::create_directories(tmp);
  json model_sum;
  if (rank_ == 0) {
    // A crashed earlier attempt at this step may have left any file in tmp: this one is written afresh.
    const std::string path = (tmp / kModelFile).string();
    H5File f = H5File::create(path);
    f.set_attr("/", "format_version", kCheckpointFormatVersion);
    f.set_attr("/", "step", c.step);
    f.set_json_attr("/", "config", c.config);
    f.set_json_attr("/", "tensor_names", names_of(c.model));
    for (const auto& [tname, t] : c.model) f.write_tensor(tname, t);
    f.close();
    fsync_path(path, false);
    model_sum = file_sum(path);
    stage(SaveStage::kModelWritten);
  }
  {
    const std::string path = (tmp / optim_file(rank_)).string();
    H5File f = H5File::create(path);
    f.set_attr("/", "format_version", kCheckpointFormatVersion);
    f.set_attr("/", "step", c.step);
    f.set_attr("/", "rank", int64_t(rank_));
    f.set_attr("/", "world_size", int64_t(world_size_));
    f.set_json_attr("/", "shard_layout", c.shard_layout);
    f.set_json_attr("/", "meta", mine.meta);
    f.set_json_attr("/", "tensor_names", names_of(mine.tensors));
    f.create_group("tensors");
    for (const auto& [tname, t] : mine.tensors) f.write_tensor("tensors/" + tname, t);
    at::Tensor rng = at::empty({int64_t(mine.rng_state.size())}, at::kByte);
    if (!mine.rng_state.empty()) std::memcpy(rng.data_ptr(), mine.rng_state.data(), mine.rng_state.size());
    f.write_tensor("rng_state", rng);
    if (!mine.cuda_rng_state.empty()) {
      at::Tensor crng = at::empty({int64_t(mine.cuda_rng_state.size())}, at::kByte);
      std::memcpy(crng.data_ptr(), mine.cuda_rng_state.data(), mine.cuda_rng_state.size());
      f.write_tensor("cuda_rng_state", crng);
    }
    f.close();
    fsync_path(path, false);
    write_file_synced((tmp / sum_file(rank_)).string(), file_sum(path).dump());
  }
  stage(SaveStage::kRankFileWritten);
  sync();
  if (rank_ == 0) mgr.remove_stale_tmp(tmp.filename().string());
  stage(SaveStage::kRanksSynced);

  if (rank_ == 0) {
    // Anything not written by this save (a crashed earlier attempt at this step, another world size) goes.
    std::set<std::string> expected{kModelFile};
    for (int r = 0; r < world_size_; ++r) expected.insert({optim_file(r), sum_file(r)});
    std::vector<fs::path> foreign;
    for (const auto& e : fs::directory_iterator(tmp))
      if (!expected.count(e.path().filename().string())) foreign.push_back(e.path());
    for (const auto& p : foreign)
      if (!remove_tree(p)) throw std::runtime_error("checkpoint: cannot remove stale " + p.string());

    // 2. (The model weights were written in step 1.) 3. Trainer state.
    json state{{"format_version", kCheckpointFormatVersion}, {"step", c.step},
               {"world_size", world_size_},           {"config", c.config},
               {"trainer_state", c.trainer_state},   {"data_position", c.data_position},
               {"shard_layout", c.shard_layout}};
    write_file_synced((tmp / kStateFile).string(), state.dump(1));
    stage(SaveStage::kTrainerStateWritten);

    // 4. Manifest with every file's size and CRC-32 (rank files' sums come from their side files), written last.
    json files = json::object();
    files[kModelFile] = model_sum;
    files[kStateFile] = file_sum((tmp / kStateFile).string());
    for (int r = 0; r < world_size_; ++r) {
      const fs::path sp = tmp / sum_file(r);
      json s = read_json_file(sp.string());
      uint64_t size = fs::file_size(tmp / optim_file(r));
      if (s.at("bytes").get<uint64_t>() != size)
        throw std::runtime_error("checkpoint: " + (tmp / optim_file(r)).string() + " has " + std::to_string(size) +
                                 " bytes but its rank recorded " + s.at("bytes").dump());
      files[optim_file(r)] = s;
      ::unlink(sp.c_str());
    }
    json manifest{{"format", kFormat},      {"format_version", kCheckpointFormatVersion},
                  {"step", c.step},         {"world_size", world_size_},
                  {"job", opt_.job_id},     {"checksum", "crc32"},
                  {"files", files}};
    const fs::path mtmp = tmp / (std::string(kManifest) + ".partial");
    write_file_synced(mtmp.string(), manifest.dump(1));
    rename_or_throw(mtmp, tmp / kManifest);
    fsync_path(tmp.string(), true);
    stage(SaveStage::kManifestWritten);

    // 5. Commit: atomic rename into place. An existing step-N is moved aside first: deleted after the rename when
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

    // 6. Retention.
    if (opt_.keep_last > 0) mgr.prune(opt_.keep_last, c.step, opt_.job_id);
    stage(SaveStage::kPruned);
  }
  sync();
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

std::string CheckpointManager::verify(const std::string& step_dir, bool checksums) {
  const fs::path dir(step_dir);
  const fs::path mpath = dir / kManifest;
  if (!fs::exists(mpath)) return "no " + std::string(kManifest) + " (incomplete save)";
  json m;
  try {
    m = read_json_file(mpath.string());
    if (m.value("format", "") != kFormat) return "manifest.json is not a " + std::string(kFormat) + " manifest";
    int64_t step = m.at("step").get<int64_t>();
    int64_t dir_step = parse_step_dir(dir.filename().string());
    if (dir_step >= 0 && dir_step != step)
      return "manifest.json says step " + std::to_string(step) + " but the directory is " + dir.filename().string();
    const json& w = m.at("world_size");
    if (!w.is_number_integer() || w.get<int64_t>() < 1 || w.get<int64_t>() > (1 << 20))
      return "manifest.json world_size " + w.dump() + " is not a rank count (1 or more)";
    const int world = w.get<int>();
    const json& files = m.at("files");
    // Exactly one optimizer file per rank 0..world_size-1: a world_size that disagrees with the files is
    // named here, instead of failing later when the optimizer state is resharded.
    int listed = 0;
    for (const auto& [fname, info] : files.items()) {
      (void)info;
      if (fname.rfind("optim-rank-", 0) != 0 || fname.size() < 15 ||
          fname.compare(fname.size() - 3, 3, ".h5") != 0)
        continue;
      ++listed;
      const std::string idx = fname.substr(11, fname.size() - 14);
      if (idx.empty() || idx.find_first_not_of("0123456789") != std::string::npos || std::stoll(idx) >= world)
        return "manifest.json is inconsistent: world_size " + std::to_string(world) + " but it lists " +
               fname;
    }
    if (listed != world)
      return "manifest.json is inconsistent: world_size " + std::to_string(world) +
             " but it lists the optimizer files of " + std::to_string(listed) + " rank(s)";
    std::vector<std::string> required{kModelFile, kStateFile};
    for (int r = 0; r < world; ++r) required.push_back(optim_file(r));
    for (const auto& f : required)
      if (!files.contains(f)) return "manifest.json does not list " + f;
    for (const auto& [fname, info] : files.items()) {
      const fs::path p = dir / fname;
      std::error_code ec;
      uint64_t size = fs::file_size(p, ec);
      if (ec) return fname + " is missing";
      uint64_t want = info.at("bytes").get<uint64_t>();
      if (size != want)
        return fname + " has " + std::to_string(size) + " bytes, manifest says " + std::to_string(want) +
               " (truncated?)";
      if (checksums) {
        std::string crc = hex32(crc32_file(p.string()));
        if (crc != info.at("crc32").get<std::string>())
          return fname + " CRC-32 " + crc + " does not match manifest " + info.at("crc32").get<std::string>() +
                 " (corrupt)";
      }
    }
  } catch (const std::exception& e) {
    return std::string("unreadable manifest or file: ") + e.what();
  }
  return "";
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

void CheckpointManager::remove_stale_tmp(const std::string& keep) const {
  std::error_code ec;
  fs::directory_iterator it(checkpoints_dir(), ec), end;
  if (ec) return;
  std::vector<fs::path> stale;
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    const std::string n = it->path().filename().string();
    if (n.size() > 4 && n.compare(n.size() - 4, 4, ".tmp") == 0 && n != keep) stale.push_back(it->path());
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

namespace checkpoint_files {

json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("checkpoint: cannot open " + path);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw std::runtime_error("checkpoint: " + path + " is not valid JSON: " + e.what());
  }
}

}  // namespace checkpoint_files

}  // namespace gmod

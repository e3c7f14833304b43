// Checkpoint reading (CheckpointReader: manifest, model and per-rank optimizer state) and the RNG state
// bytes; see checkpoint.h for the layout.
#include <ATen/core/grad_mode.h>

#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>
#include <string>

#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/checkpoint_files.h"
#include "trainer/checkpoint/hdf5_file.h"

namespace gmod {
namespace fs = std::filesystem;
using nlohmann::json;
using namespace checkpoint_files;

// ---------------------------------------------------------------------------------------------------- reader

CheckpointReader::CheckpointReader(std::string step_dir) : dir_(std::move(step_dir)) {
  const fs::path d(dir_);
  if (!fs::exists(d / kManifest))
    throw std::runtime_error("checkpoint: " + dir_ + " has no " + kManifest +
                             " (incomplete or not a checkpoint)");
  manifest_ = read_json_file((d / kManifest).string());
  state_ = read_json_file((d / kStateFile).string());
  try {
    step_ = manifest_.at("step").get<int64_t>();
    world_size_ = manifest_.at("world_size").get<int>();
    const int64_t version = manifest_.at("format_version").get<int64_t>();
    if (version != kCheckpointFormatVersion)
      throw std::runtime_error("format_version " + std::to_string(version) +
                               ", this gmod reads format_version " +
                               std::to_string(kCheckpointFormatVersion) +
                               (version > kCheckpointFormatVersion ? " (written by a newer gmod)" : ""));
    for (const char* k : {"config", "trainer_state", "data_position", "shard_layout"})
      if (!state_.contains(k)) throw std::runtime_error(std::string("missing key ") + k);
    if (state_.contains("world_size") && state_["world_size"] != manifest_.at("world_size"))
      throw std::runtime_error("manifest.json world_size " + manifest_.at("world_size").dump() +
                               " disagrees with " + kStateFile + " world_size " +
                               state_["world_size"].dump());
  } catch (const std::exception& e) {
    throw std::runtime_error("checkpoint: bad manifest or trainer state in " + dir_ + ": " + e.what());
  }
}

void CheckpointReader::verify(bool checksums) const {
  std::string why = CheckpointManager::verify(dir_, checksums);
  if (!why.empty()) throw std::runtime_error("checkpoint: " + dir_ + " failed verification: " + why);
}

namespace checkpoint_files {

std::vector<std::pair<std::string, std::vector<std::string>>> model_part_index(const std::string& dir) {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  H5File f = H5File::open((fs::path(dir) / kModelFile).string());
  if (!f.has_attr("/", "parts")) {
    out.emplace_back(kModelFile, f.attr_json("/", "tensor_names").get<std::vector<std::string>>());
    return out;
  }
  out.emplace_back(kModelFile, f.attr_json("/", "own_tensor_names").get<std::vector<std::string>>());
  for (const auto& part : f.attr_json("/", "parts").get<std::vector<std::string>>()) {
    if (part.empty() || part.find('/') != std::string::npos || part == kModelFile)
      throw std::runtime_error("checkpoint: " + f.path() + " names a bad model part '" + part + "'");
    const fs::path p = fs::path(dir) / part;
    if (!fs::exists(p))
      throw std::runtime_error("checkpoint: " + f.path() + " lists the model part " + part + ", which is missing");
    out.emplace_back(part, H5File::open(p.string()).attr_json("/", "tensor_names").get<std::vector<std::string>>());
  }
  return out;
}

}  // namespace checkpoint_files

namespace {

// Every model tensor's file, from model_part_index.
std::map<std::string, std::string> tensor_files(const std::string& dir) {
  std::map<std::string, std::string> where;
  for (const auto& [file, names] : model_part_index(dir))
    for (const auto& n : names) where.emplace(n, file);
  return where;
}

// The model files of a checkpoint, opened once each.
class ModelFiles {
 public:
  ModelFiles(std::string dir, std::vector<std::string>* crc_failures)
      : dir_(std::move(dir)), where_(tensor_files(dir_)), crc_failures_(crc_failures) {}
  bool has(const std::string& name) const { return where_.count(name) > 0; }
  const std::string& file_of(const std::string& name) const {
    auto it = where_.find(name);
    if (it == where_.end())
      throw std::runtime_error("checkpoint: tensor '" + name + "' not in the model files of " + dir_);
    return it->second;
  }
  H5File& open(const std::string& name) {
    const std::string& file = file_of(name);
    auto it = open_.find(file);
    if (it == open_.end()) {
      it = open_.emplace(file, H5File::open((fs::path(dir_) / file).string())).first;
      it->second.set_crc_failures(crc_failures_);
    }
    return it->second;
  }

 private:
  std::string dir_;
  std::map<std::string, std::string> where_;
  std::map<std::string, H5File> open_;
  std::vector<std::string>* crc_failures_;
};

}  // namespace

std::vector<std::string> CheckpointReader::model_tensor_names() const {
  H5File f = H5File::open((fs::path(dir_) / kModelFile).string());
  return f.attr_json("/", "tensor_names").get<std::vector<std::string>>();
}

std::vector<std::string> CheckpointReader::model_files() const {
  std::vector<std::string> out;
  for (const auto& [file, names] : model_part_index(dir_)) out.push_back(file);
  return out;
}

at::Tensor CheckpointReader::read_model_tensor(const std::string& name) const {
  ModelFiles files(dir_, crc_failures_);
  return files.open(name).read_tensor(name, !files_verified_);
}

NamedTensors CheckpointReader::read_model() const {
  ModelFiles files(dir_, crc_failures_);
  NamedTensors out;
  for (const auto& n : model_tensor_names()) out.emplace_back(n, files.open(n).read_tensor(n, !files_verified_));
  return out;
}

void CheckpointReader::load_model_into(const NamedTensors& params, bool strict) const {
  load_model_into(params, strict, ModelShare{});
}

void CheckpointReader::load_model_into(const NamedTensors& params, bool strict, const ModelShare& share) const {
  const std::string index = (fs::path(dir_) / kModelFile).string();
  auto saved = model_tensor_names();
  std::set<std::string> saved_set(saved.begin(), saved.end());
  std::vector<std::string> missing;
  for (const auto& [name, p] : params)
    if (!saved_set.count(name)) missing.push_back(name);
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 10; ++i) list += (i ? ", " : "") + missing[i];
    throw std::runtime_error("checkpoint: " + std::to_string(missing.size()) + " parameter(s) missing from " +
                             index + ": " + list);
  }
  if (strict) {
    std::set<std::string> wanted;
    for (const auto& [name, p] : params) wanted.insert(name);
    for (const auto& n : saved)
      if (!wanted.count(n))
        throw std::runtime_error("checkpoint: " + index + " has tensor '" + n +
                                 "' that the model does not (strict load)");
  }
  ModelFiles files(dir_, crc_failures_);
  // Check everything before modifying anything (metadata only).
  for (const auto& [name, p] : params) {
    H5File& f = files.open(name);
    H5TensorInfo info = f.tensor_info(name);
    if (info.shape != p.sizes().vec())
      throw std::runtime_error("checkpoint: tensor '" + name + "' in " + f.path() + " has shape " +
                               c10::str(at::IntArrayRef(info.shape)) + ", the model expects " +
                               c10::str(p.sizes()));
    if (info.dtype != p.scalar_type())
      throw std::runtime_error("checkpoint: tensor '" + name + "' in " + f.path() + " is " +
                               h5_dtype_name(info.dtype) + ", the model expects " +
                               c10::toString(p.scalar_type()));
  }
  // Whole: every tensor read here. Shared: the file of part k is read by rank k % world only, each tensor then
  // broadcast from its reader, so the weights are read once per job instead of once per rank.
  std::map<std::string, int> reader_of;
  if (share.broadcast) {
    int k = 0;
    for (const auto& [file, names] : model_part_index(dir_)) {
      for (const auto& n : names) reader_of[n] = k % share.world_size;
      ++k;
    }
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, p] : params) {
    at::Tensor t = p.detach();
    // Straight into the parameter's memory when it is a contiguous CPU tensor of the stored dtype (no temporary,
    // one pass); else through a temporary (read_tensor_into).
    if (!share.broadcast) {
      files.open(name).read_tensor_into(name, t, !files_verified_);
      continue;
    }
    const int root = reader_of.at(name);
    if (root == share.rank) files.open(name).read_tensor_into(name, t, !files_verified_);
    share.broadcast(t, root);
  }
}

RankState CheckpointReader::read_rank_state(int rank, const std::map<std::string, at::Tensor>& into) const {
  if (rank < 0 || rank >= world_size_)
    throw std::out_of_range("checkpoint: rank " + std::to_string(rank) + " out of range for " + dir_ +
                            " (saved with world size " + std::to_string(world_size_) + ")");
  H5File f = H5File::open((fs::path(dir_) / optim_file(rank)).string());
  f.set_crc_failures(crc_failures_);
  RankState s;
  s.rank = int(f.attr_int("/", "rank"));
  s.world_size = int(f.attr_int("/", "world_size"));
  if (s.rank != rank || s.world_size != world_size_)
    throw std::runtime_error("checkpoint: " + f.path() + " says rank " + std::to_string(s.rank) + " of " +
                             std::to_string(s.world_size) + ", expected rank " + std::to_string(rank) +
                             " of " + std::to_string(world_size_));
  s.meta = f.attr_json("/", "meta");
  s.shard_layout = f.attr_json("/", "shard_layout");
  for (const auto& n : f.attr_json("/", "tensor_names").get<std::vector<std::string>>()) {
    const auto dst = into.find(n);
    if (dst == into.end()) {
      s.tensors.emplace_back(n, f.read_tensor("tensors/" + n, !files_verified_));
    } else {
      f.read_tensor_into("tensors/" + n, dst->second, !files_verified_);
      s.tensors.emplace_back(n, dst->second);
    }
  }
  at::Tensor rng = f.read_tensor("rng_state", !files_verified_);
  if (rng.scalar_type() != at::kByte || rng.dim() != 1)
    throw std::runtime_error("checkpoint: rng_state in " + f.path() + " is not a 1-D uint8 dataset");
  const auto* p = rng.data_ptr<uint8_t>();
  s.rng_state.assign(p, p + rng.numel());
  if (f.exists("cuda_rng_state")) {
    at::Tensor crng = f.read_tensor("cuda_rng_state", !files_verified_);
    if (crng.scalar_type() != at::kByte || crng.dim() != 1)
      throw std::runtime_error("checkpoint: cuda_rng_state in " + f.path() + " is not a 1-D uint8 dataset");
    const auto* q = crng.data_ptr<uint8_t>();
    s.cuda_rng_state.assign(q, q + crng.numel());
  }
  return s;
}

std::vector<RankState> CheckpointReader::read_all_rank_states() const {
  std::vector<RankState> out;
  out.reserve(size_t(world_size_));
  for (int r = 0; r < world_size_; ++r) out.push_back(read_rank_state(r));
  return out;
}

// ---------------------------------------------------------------------------------------------------- RNG

std::vector<uint8_t> generator_state_bytes(at::Generator gen) {
  at::Tensor s;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    s = gen.get_state();
  }
  s = s.to(at::kCPU).contiguous();
  if (s.scalar_type() != at::kByte) throw std::runtime_error("generator state is not a uint8 tensor");
  const auto* p = s.data_ptr<uint8_t>();
  return std::vector<uint8_t>(p, p + s.numel());
}

void set_generator_state_bytes(at::Generator gen, const std::vector<uint8_t>& state) {
  at::Tensor s = at::empty({int64_t(state.size())}, at::kByte);
  if (!state.empty()) std::memcpy(s.data_ptr(), state.data(), state.size());
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(s);
}

}  // namespace gmod

// A checkpoint's named tensors over safetensors and torch.save files. See checkpoint_files.h.
#include "model/checkpoint_files.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "model/posix_path.h"
#include "model/safetensors.h"
#include "model/strings.h"
#include "model/torch_save.h"

namespace gmod {
using json = nlohmann::json;

namespace {

using posix_path::exists;
using posix_path::is_dir;
using posix_path::is_file;
using posix_path::join;
using posix_path::parent_dir;

bool is_torch_save_name(const std::string& p) {
  return ends_with(p, ".bin") || ends_with(p, ".pt") || ends_with(p, ".pth");
}

// The dtypes a torch.save state dict may hold here: those safetensors has and gmod reads.
bool readable_dtype(at::ScalarType t) {
  switch (t) {
    case at::kBool: case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong:
    case at::kHalf: case at::kBFloat16: case at::kFloat: case at::kDouble:
      return true;
    default:
      return false;
  }
}

}  // namespace

struct CheckpointFiles::File {
  std::string path;
  std::unique_ptr<SafetensorsFile> st;             // a safetensors file, or
  std::map<std::string, at::Tensor> pickled;       // a torch.save file's tensors
  explicit File(const std::string& p) : path(p) {
    if (!is_torch_save_name(p)) {
      st = std::make_unique<SafetensorsFile>(p);
      return;
    }
    for (auto& [name, t] : read_torch_save(p)) {
      if (t.layout() != at::kStrided || t.is_quantized() || !readable_dtype(t.scalar_type()))
        throw std::runtime_error(p + ": tensor '" + name + "' is a " + std::string(c10::toString(t.scalar_type())) +
                                 (t.is_quantized() ? " quantized" : "") +
                                 " tensor; a checkpoint's tensors are bool, (u)int8, int16/32/64, float16, "
                                 "bfloat16, float32 or float64");
      if (!pickled.emplace(name, t).second)
        throw std::runtime_error(p + ": tensor '" + name + "' appears twice (nested dict keys joined with '.')");
    }
  }
  std::vector<std::string> names() const {
    if (st) return st->names();
    std::vector<std::string> out;
    for (const auto& kv : pickled) out.push_back(kv.first);
    return out;
  }
  bool has(const std::string& n) const { return st ? st->has(n) : pickled.count(n) != 0; }
  at::Tensor tensor(const std::string& n) const { return st ? st->tensor(n) : pickled.at(n); }
};

CheckpointFiles::~CheckpointFiles() = default;
CheckpointFiles::CheckpointFiles(CheckpointFiles&&) noexcept = default;
CheckpointFiles& CheckpointFiles::operator=(CheckpointFiles&&) noexcept = default;

CheckpointFiles::CheckpointFiles(const std::string& path) : path_(path) {
  auto open_file = [&](const std::string& p) {
    files_.push_back(std::make_unique<File>(p));
    return files_.size() - 1;
  };
  auto add_all = [&](size_t idx) {
    for (const auto& n : files_[idx]->names()) {
      auto [it, fresh] = where_.emplace(n, idx);
      if (!fresh)
        throw std::runtime_error("checkpoint: tensor '" + n + "' appears in both " + files_[it->second]->path +
                                 " and " + files_[idx]->path);
    }
  };
  auto open_index = [&](const std::string& index) {
    std::ifstream in(index);
    if (!in) throw std::runtime_error("checkpoint: " + index + ": cannot open index");
    json j;
    try {
      j = json::parse(in);
    } catch (const json::exception& e) {
      throw std::runtime_error("checkpoint: " + index + ": malformed index JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw std::runtime_error("checkpoint: " + index + ": no \"weight_map\" object");
    const std::string dir = parent_dir(index);
    std::map<std::string, size_t> shard_idx;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      const std::string& name = it.key();
      if (!it->is_string())
        throw std::runtime_error("checkpoint: " + index + ": weight_map entry for tensor '" + name +
                                 "' is not a string");
      const std::string shard = it->get<std::string>();
      if (shard.find('/') != std::string::npos)
        throw std::runtime_error("checkpoint: " + index + ": weight_map maps tensor '" + name + "' to '" + shard +
                                 "', a path outside the index's directory (shards are file names)");
      auto s = shard_idx.find(shard);
      if (s == shard_idx.end()) {
        const std::string sp = join(dir, shard);
        if (!is_file(sp))
          throw std::runtime_error("checkpoint: " + index + ": weight_map maps tensor '" + name + "' to shard " + sp +
                                   ", which does not exist");
        s = shard_idx.emplace(shard, open_file(sp)).first;
      }
      if (!files_[s->second]->has(name))
        throw std::runtime_error("checkpoint: " + index + ": weight_map maps tensor '" + name + "' to shard " +
                                 files_[s->second]->path + ", which has no such tensor");
      where_[name] = s->second;
    }
  };

  const std::string& p = path;
  if (is_dir(p)) {
    if (exists(join(p, "model.safetensors.index.json"))) {
      open_index(join(p, "model.safetensors.index.json"));
    } else if (exists(join(p, "model.safetensors"))) {
      add_all(open_file(join(p, "model.safetensors")));
    } else if (exists(join(p, "pytorch_model.bin.index.json"))) {
      open_index(join(p, "pytorch_model.bin.index.json"));
    } else if (exists(join(p, "pytorch_model.bin"))) {
      add_all(open_file(join(p, "pytorch_model.bin")));
    } else {
      std::vector<std::string> found;
      DIR* d = ::opendir(p.c_str());
      if (!d) throw std::runtime_error("checkpoint: " + path + ": cannot list directory: " + std::strerror(errno));
      while (const dirent* e = ::readdir(d)) {
        const std::string fn = e->d_name;
        if (ends_with(fn, ".safetensors") && is_file(join(p, fn))) found.push_back(join(p, fn));
      }
      ::closedir(d);
      std::sort(found.begin(), found.end());
      if (found.empty())
        throw std::runtime_error("checkpoint: " + path +
                                 ": directory has no model.safetensors.index.json, model.safetensors, "
                                 "pytorch_model.bin.index.json, pytorch_model.bin or *.safetensors");
      for (const auto& f : found) add_all(open_file(f));
    }
  } else if (exists(p)) {
    if (ends_with(p, ".index.json"))
      open_index(p);
    else
      add_all(open_file(p));
  } else {
    throw std::runtime_error("checkpoint: " + path + ": no such file or directory");
  }
  for (const auto& f : files_)
    if (f->st) {
      metadata_ = f->st->metadata();
      break;
    }
}

std::vector<std::string> CheckpointFiles::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& kv : where_) out.push_back(kv.first);
  std::sort(out.begin(), out.end());
  return out;
}

const CheckpointFiles::File& CheckpointFiles::file(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) {
    std::string what = files_.size() == 1 ? "no such tensor in the file" : "no such tensor in the checkpoint";
    throw std::runtime_error("checkpoint: " + path_ + ": tensor '" + name + "': " + what);
  }
  return *files_[it->second];
}

at::Tensor CheckpointFiles::tensor(const std::string& name) const { return file(name).tensor(name); }

at::ScalarType CheckpointFiles::scalar_type(const std::string& name) const {
  const File& f = file(name);
  return f.st ? f.st->info(name).scalar_type : f.pickled.at(name).scalar_type();
}

std::vector<int64_t> CheckpointFiles::shape(const std::string& name) const {
  const File& f = file(name);
  return f.st ? f.st->info(name).shape : f.pickled.at(name).sizes().vec();
}

const std::string& CheckpointFiles::file_of(const std::string& name) const { return file(name).path; }

std::vector<std::string> CheckpointFiles::files() const {
  std::vector<std::string> out;
  for (const auto& f : files_) out.push_back(f->path);
  std::sort(out.begin(), out.end());
  return out;
}

bool CheckpointFiles::pickled() const {
  return std::any_of(files_.begin(), files_.end(), [](const auto& f) { return !f->st; });
}

}  // namespace gmod

// A checkpoint as a set of named tensors read from its files, whatever they are: safetensors (model/safetensors.h,
// mmap'd, lazy) or PyTorch `.bin` files written by torch.save (model/torch_save.h: the state dicts transformers'
// save_pretrained writes with safe_serialization=False and the Trainer with save_safetensors=False, both defaults
// up to transformers 4.34; 4.35 made safetensors the default). Every Hugging Face directory gmod reads (load_weights, the
// composed towers, the MoD checkpoint loaders, the CLI) opens its weights through this class, so both formats go
// through the same name, shape and dtype checks.
//
// `path` may be a .safetensors file, a .bin / .pt / .pth file (torch.save), a *.index.json file (safetensors or
// pytorch_model.bin index), or a directory holding, in the order transformers' from_pretrained looks for them:
// model.safetensors.index.json, model.safetensors, pytorch_model.bin.index.json, pytorch_model.bin; else every
// *.safetensors file in it (a name present in two files is an error). A directory's other .bin files (the Trainer's
// training_args.bin, LLaVA's mm_projector.bin) are never opened. An index's weight_map is the checkpoint's name
// list: every mapped shard must exist and hold its tensors.
//
// The .bin files are unpickled by LibTorch's own unpickler (no Python, nothing executed); each must hold a dict of
// name -> tensor of a dtype safetensors has (BOOL, U8, I8, I16, I32, I64, F16, BF16, F32, F64); anything else (a
// global of another class, an int, a list, a nested object) is an error naming the file and the entry. Their
// tensors are read when the file is opened and kept in memory (contiguous CPU tensors), where safetensors tensors
// view the mapped file; tensors the file stores as aliases of one storage (a tied or shared weight) share it here.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace gmod {

class CheckpointFiles {
 public:
  explicit CheckpointFiles(const std::string& path);
  ~CheckpointFiles();
  CheckpointFiles(CheckpointFiles&&) noexcept;
  CheckpointFiles& operator=(CheckpointFiles&&) noexcept;

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  // A CPU tensor; safetensors tensors view the read-only mapping (never write to them: copy_into or clone).
  at::Tensor tensor(const std::string& name) const;
  at::ScalarType scalar_type(const std::string& name) const;  // Undefined: a safetensors dtype gmod does not read
  std::vector<int64_t> shape(const std::string& name) const;
  const std::string& file_of(const std::string& name) const;  // path of the file holding `name` (for messages)
  std::vector<std::string> files() const;                     // paths of the opened files, sorted
  bool pickled() const;  // the tensors come from torch.save files
  const std::map<std::string, std::string>& metadata() const { return metadata_; }  // first safetensors __metadata__

  struct File;  // one opened file (model/checkpoint_files.cpp)

 private:
  const File& file(const std::string& name) const;
  std::string path_;
  std::vector<std::unique_ptr<File>> files_;
  std::unordered_map<std::string, size_t> where_;  // name -> index in files_
  std::map<std::string, std::string> metadata_;
};

// The checkpoint reader's former name (it read safetensors only).
using SafetensorsCheckpoint = CheckpointFiles;

}  // namespace gmod

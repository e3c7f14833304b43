// safetensors I/O: read-only mmap'd reader for one file (SafetensorsFile), an atomic writer (single file or shards +
// index), and copy_into() for loading a checkpoint tensor into a parameter. A checkpoint directory (safetensors or
// PyTorch .bin, single or sharded) is read by CheckpointFiles (model/checkpoint_files.h, included below).
//
// Format (huggingface/safetensors): 8-byte little-endian u64 N, N bytes of UTF-8 JSON header (may be right-padded with
// spaces), then the byte buffer. Header entries {"dtype", "shape", "data_offsets":[begin,end)} relative to the buffer;
// the entries must cover the buffer exactly (no overlap, no holes, no trailing bytes), as the Rust reference checks.
//
// Tensors returned by SafetensorsFile::tensor() VIEW the read-only mapping (PROT_READ): they are valid as long as the
// tensor lives (the deleter holds the mapping), but must never be written to (an in-place op would SIGSEGV). Callers
// copy them into parameters (copy_into) or .clone() them.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/checkpoint_files.h"

namespace gmod {

// One header entry.
struct SafetensorsInfo {
  std::string dtype;                  // safetensors name: "BF16", "F32", ...
  at::ScalarType scalar_type;         // at::ScalarType::Undefined when the dtype is valid but not supported here
  std::vector<int64_t> shape;         // C order; empty = 0-rank
  uint64_t begin = 0, end = 0;        // data_offsets relative to the byte buffer, end exclusive
  uint64_t nbytes() const { return end - begin; }
  int64_t numel() const;
};

// Supported dtypes: BOOL, U8, I8, I16, I32, I64, F16, BF16, F32, F64. Other dtypes of the safetensors spec (U16, U32,
// U64, F8_*, ...) are validated when the file is opened but tensor() throws "unsupported dtype X"; a dtype string
// unknown to the spec makes opening fail.
class SafetensorsFile {
 public:
  // Maps and validates the file; throws std::runtime_error naming the path (and tensor) on any problem.
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  const SafetensorsInfo& info(const std::string& name) const;  // throws if absent
  // A CPU tensor viewing the mapped bytes (read-only, see above). Empty tensors are fresh allocations; a tensor whose
  // bytes are not aligned to its item size is copied into an aligned allocation.
  at::Tensor tensor(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t file_size() const { return file_size_; }

 private:
  struct Mapping;
  std::string path_;
  std::shared_ptr<Mapping> map_;
  uint64_t file_size_ = 0;
  uint64_t data_start_ = 0;  // 8 + N
  std::unordered_map<std::string, SafetensorsInfo> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (any device/layout; copied to contiguous CPU) in insertion order to `path` atomically: written to
// path + ".tmp", fsync'd, renamed over `path`. Header is padded with spaces to a multiple of 8. Duplicate names or
// unsupported dtypes throw.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Writes `tensors` into `dir` (created if needed) as model-0000k-of-0000n.safetensors, each at most max_shard_bytes
// of tensor data (a larger tensor gets a shard of its own), then model.safetensors.index.json (written last,
// atomically). `metadata` goes into every shard's __metadata__ and into the index "metadata" next to total_size.
// Returns the shard file names (without directory) in order.
std::vector<std::string> save_safetensors_sharded(const std::string& dir,
                                                  const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                                  uint64_t max_shard_bytes,
                                                  const std::map<std::string, std::string>& metadata = {});

// dst.copy_(src) without autograd, after checking the shapes match (error names tensor `name`, `file`, expected and
// actual shapes). Converts between floating dtypes (BF16/F16/F32/F64) and across devices; a floating <-> integral/bool
// mismatch throws.
void copy_into(at::Tensor& dst, const at::Tensor& src, const std::string& name, const std::string& file);

// "BF16" etc. for a supported ScalarType; throws otherwise.
std::string safetensors_dtype_name(at::ScalarType t);

}  // namespace gmod

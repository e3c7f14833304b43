// Thin RAII wrapper over the HDF5 1.10 C API for checkpoint files: tensors as contiguous datasets, typed attributes.
//
// Storage of at::Tensor dtypes (every dataset also gets a string attribute `dtype` naming the torch dtype):
//   float32 -> H5T_IEEE_F32LE   float64 -> H5T_IEEE_F64LE   int64 -> H5T_STD_I64LE   int32 -> H5T_STD_I32LE
//   int16 -> H5T_STD_I16LE      int8 -> H5T_STD_I8LE        uint8 -> H5T_STD_U8LE    bool -> H5T_STD_U8LE ("bool")
//   bfloat16 -> H5T_STD_U16LE, raw bits, dtype="bfloat16"   float16 -> H5T_STD_U16LE, raw bits, dtype="float16"
// h5py reads the 16-bit ones as uint16; `torch.from_numpy(a).view(torch.bfloat16)` restores them bit-exactly.
// Optionally each dataset carries an attribute `crc32` (zlib CRC-32 of the raw little-endian bytes) verified on read.
// Every HDF5 failure becomes an Hdf5Error naming the file and the object; HDF5's own error printing is silenced.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <hdf5.h>

#include "trainer/checkpoint/crc32.h"
#include "trainer/checkpoint/direct_write.h"
#include "trainer/checkpoint/file_crc.h"

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace gmod {

class Hdf5Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Owns one hid_t (file, group, dataset, dataspace, datatype, attribute or property list); closes it on destruction.
class H5Id {
 public:
  H5Id() = default;
  explicit H5Id(hid_t id) : id_(id) {}
  H5Id(H5Id&& o) noexcept : id_(o.id_) { o.id_ = H5I_INVALID_HID; }
  H5Id& operator=(H5Id&& o) noexcept;
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  ~H5Id() { reset(); }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  hid_t release() {  // gives up ownership without closing
    hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }
  void reset();  // closes the handle (errors while closing are ignored; use H5File::close() to see them)

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// Shape and storage dtype of a dataset, read without loading its data.
struct H5TensorInfo {
  std::vector<int64_t> shape;
  at::ScalarType dtype;
};

// One open HDF5 file. Object names are paths inside the file ("/", "tensors/exp_avg"); intermediate groups are
// created on write. Not copyable; movable.
class H5File {
 public:
  // Creates (truncating an existing file) for writing. With `direct_data`, datasets of at least
  // kDirectDataMinBytes are placed at 4 KiB-aligned offsets, allocated but never filled by HDF5, and their bytes are
  // written there with O_DIRECT by a background thread (trainer/checkpoint/direct_write.h) while the file is built;
  // close() waits for them. The file's format is the same.
  static H5File create(const std::string& path, bool direct_data = false);
  static constexpr uint64_t kDirectDataMinBytes = 1u << 20;
  // Opens an existing file read-only (or read-write).
  static H5File open(const std::string& path, bool writable = false);

  H5File(H5File&&) = default;
  H5File& operator=(H5File&&) = default;
  ~H5File();

  const std::string& path() const { return path_; }
  // Flushes and closes, and waits for the direct_data writes, throwing on failure. The destructor closes silently
  // (an abandoned file).
  void close();

  void create_group(const std::string& name);
  bool exists(const std::string& name) const;  // a group or dataset at that path
  // Names of the datasets directly under `group`, in HDF5's name order.
  std::vector<std::string> list_datasets(const std::string& group = "/") const;

  // Writes `t` (any device, any strides; copied to contiguous CPU) as a new dataset. A 0-dim tensor is a scalar
  // dataset. With `checksum`, a `crc32` attribute is stored.
  void write_tensor(const std::string& name, const at::Tensor& t, bool checksum = true);
  // Reads a dataset into a new CPU tensor of its stored dtype. With `verify`, a present `crc32` attribute is checked.
  at::Tensor read_tensor(const std::string& name, bool verify = true) const;
  // Reads a dataset into an existing tensor with as many elements (its shape may differ, e.g. flat): straight into
  // its memory when it is a contiguous CPU tensor of the stored dtype (no temporary: a resume loads the optimizer
  // state in place), else through a temporary and copy_. Refuses another element count, naming the dataset.
  void read_tensor_into(const std::string& name, at::Tensor dst, bool verify = true) const;
  H5TensorInfo tensor_info(const std::string& name) const;
  // Where each checksummed dataset's bytes went in the file, with their CRC-32: crc32_file_with_known of the closed
  // file then reads only HDF5's metadata.
  const std::vector<KnownCrcRegion>& written_regions() const { return written_; }
  // The same for a file opened for reading: every contiguous dataset of at least `min_bytes` that carries a `crc32`
  // attribute, anywhere in the file (the stored CRCs, not checked here: a reader checks them as it reads).
  std::vector<KnownCrcRegion> checksummed_regions(uint64_t min_bytes) const;
  // With a sink, a read whose `crc32` check fails appends the message there and returns the bytes read instead of
  // throwing (a resume agrees over the ranks first: a throw inside a broadcast would leave the others waiting).
  void set_crc_failures(std::vector<std::string>* sink) { crc_failures_ = sink; }

  // Attributes on object `obj` ("/" for the file's root). Setting replaces an existing attribute of that name.
  void set_attr(const std::string& obj, const std::string& key, const std::string& value);
  void set_attr(const std::string& obj, const std::string& key, const char* value) {
    set_attr(obj, key, std::string(value));
  }
  void set_attr(const std::string& obj, const std::string& key, int64_t value);
  void set_attr(const std::string& obj, const std::string& key, double value);
  void set_json_attr(const std::string& obj, const std::string& key, const nlohmann::json& value);  // as a string
  bool has_attr(const std::string& obj, const std::string& key) const;
  std::string attr_string(const std::string& obj, const std::string& key) const;
  int64_t attr_int(const std::string& obj, const std::string& key) const;
  double attr_double(const std::string& obj, const std::string& key) const;
  nlohmann::json attr_json(const std::string& obj, const std::string& key) const;

 private:
  H5File(std::string path, hid_t id) : path_(std::move(path)), file_(id) {}
  [[noreturn]] void fail(const std::string& what, const std::string& obj) const;
  H5Id open_attr(const std::string& obj, const std::string& key) const;
  void write_attr(const std::string& obj, const std::string& key, hid_t file_type, hid_t mem_type, const void* buf);

  std::string path_;
  // H5Dread of `name` (info from tensor_info) into buf, then the crc32 check with `verify`.
  void read_dataset(const std::string& name, const H5TensorInfo& info, void* buf, bool verify) const;
  H5Id file_;
  std::vector<KnownCrcRegion> written_;
  std::vector<std::string>* crc_failures_ = nullptr;
  // direct_data: the large datasets' bytes, written in the background while the file is built, and their memory
  // (contiguous CPU tensors) kept alive until close() has waited for the writes.
  std::unique_ptr<BackgroundRegionWriter> direct_;
  std::vector<at::Tensor> direct_data_;
};

// Torch dtype name as stored in the `dtype` attribute ("float32", "bfloat16", ...); throws for unsupported dtypes.
std::string h5_dtype_name(at::ScalarType t);

}  // namespace gmod

// RAII over the HDF5 C API; see hdf5_file.h for the dtype mapping and the attribute conventions.
#include "trainer/checkpoint/hdf5_file.h"

#include "trainer/checkpoint/direct_write.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <c10/core/GradMode.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <vector>

namespace gmod {
namespace {

// HDF5's error-stack settings are per thread in the thread-safe build: silence the automatic printing once per thread.
void silence_hdf5() {
  thread_local bool done = false;
  if (!done) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    done = true;
  }
}

// The current thread's HDF5 error stack as "func: message; ..." (innermost last), then cleared.
std::string take_error_stack() {
  std::string out;
  auto walk = [](unsigned, const H5E_error2_t* e, void* data) -> herr_t {
    auto* s = static_cast<std::string*>(data);
    if (!s->empty()) *s += "; ";
    *s += std::string(e->func_name ? e->func_name : "?") + ": " + (e->desc ? e->desc : "?");
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walk, &out);
  H5Eclear2(H5E_DEFAULT);
  return out.empty() ? "no HDF5 error detail" : out;
}

// Contiguous datasets of at least this many bytes stored as in memory are read with pread, not H5Dread, their CRC-32
// taken as they arrive (read_file_region_crc): a resume reads gigabytes in one pass.
constexpr uint64_t kDirectReadMinBytes = uint64_t(1) << 20;

struct StorageType {
  hid_t file_type;  // predefined, little-endian
  hid_t mem_type;   // native
};

StorageType storage_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return {H5T_IEEE_F32LE, H5T_NATIVE_FLOAT};
    case at::kDouble: return {H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE};
    case at::kLong: return {H5T_STD_I64LE, H5T_NATIVE_INT64};
    case at::kInt: return {H5T_STD_I32LE, H5T_NATIVE_INT32};
    case at::kShort: return {H5T_STD_I16LE, H5T_NATIVE_INT16};
    case at::kChar: return {H5T_STD_I8LE, H5T_NATIVE_INT8};
    case at::kByte:
    case at::kBool: return {H5T_STD_U8LE, H5T_NATIVE_UINT8};
    case at::kBFloat16:
    case at::kHalf: return {H5T_STD_U16LE, H5T_NATIVE_UINT16};
    default: throw Hdf5Error(std::string("HDF5: unsupported tensor dtype ") + c10::toString(t));
  }
}

at::ScalarType dtype_from_name(const std::string& n) {
  static const std::pair<const char*, at::ScalarType> table[] = {
      {"float32", at::kFloat}, {"float64", at::kDouble}, {"int64", at::kLong},  {"int32", at::kInt},
      {"int16", at::kShort},   {"int8", at::kChar},      {"uint8", at::kByte},  {"bool", at::kBool},
      {"bfloat16", at::kBFloat16}, {"float16", at::kHalf}};
  for (const auto& [name, t] : table)
    if (n == name) return t;
  throw Hdf5Error("HDF5: unknown dtype attribute value '" + n + "'");
}

// Dtype implied by an HDF5 type alone (files written by other tools, without a `dtype` attribute).
at::ScalarType dtype_from_h5type(hid_t type) {
  H5T_class_t cls = H5Tget_class(type);
  size_t size = H5Tget_size(type);
  if (cls == H5T_FLOAT) {
    if (size == 4) return at::kFloat;
    if (size == 8) return at::kDouble;
    if (size == 2) return at::kHalf;
  } else if (cls == H5T_INTEGER) {
    bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    if (size == 8 && is_signed) return at::kLong;
    if (size == 4 && is_signed) return at::kInt;
    if (size == 2 && is_signed) return at::kShort;
    if (size == 1) return is_signed ? at::kChar : at::kByte;
  } else if (cls == H5T_ENUM && size == 1) {
    return at::kBool;  // h5py's bool enum
  }
  throw Hdf5Error("HDF5: unsupported dataset type (class " + std::to_string(int(cls)) + ", size " +
                  std::to_string(size) + ")");
}

std::vector<std::string> split_path(const std::string& p) {
  std::vector<std::string> parts;
  std::stringstream ss(p);
  std::string s;
  while (std::getline(ss, s, '/'))
    if (!s.empty()) parts.push_back(s);
  return parts;
}

H5Id vlen_string_type() {
  H5Id t(H5Tcopy(H5T_C_S1));
  H5Tset_size(t.get(), H5T_VARIABLE);
  H5Tset_cset(t.get(), H5T_CSET_UTF8);
  return t;
}

H5Id make_fapl() {
  H5Id fapl(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG);
  return fapl;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------- H5Id

H5Id& H5Id::operator=(H5Id&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

void H5Id::reset() {
  if (id_ >= 0) {
    silence_hdf5();
    if (H5Iis_valid(id_) > 0) H5Idec_ref(id_);
    H5Eclear2(H5E_DEFAULT);
  }
  id_ = H5I_INVALID_HID;
}

// ---------------------------------------------------------------------------------------------------- H5File

H5File H5File::create(const std::string& path, bool direct_data) {
  silence_hdf5();
  H5Id fapl = make_fapl();
  // Large objects (the deferred datasets) start on 4 KiB boundaries, as O_DIRECT writes need.
  if (direct_data) H5Pset_alignment(fapl.get(), kDirectDataMinBytes, 4096);
  hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get());
  if (id < 0) throw Hdf5Error("HDF5: cannot create file " + path + ": " + take_error_stack());
  H5File f(path, id);
  if (direct_data) f.direct_ = std::make_unique<BackgroundRegionWriter>(path);
  return f;
}

H5File H5File::open(const std::string& path, bool writable) {
  silence_hdf5();
  H5Id fapl = make_fapl();
  hid_t id = H5Fopen(path.c_str(), writable ? H5F_ACC_RDWR : H5F_ACC_RDONLY, fapl.get());
  if (id < 0) throw Hdf5Error("HDF5: cannot open file " + path + ": " + take_error_stack());
  return H5File(path, id);
}

H5File::~H5File() {
  file_.reset();
  direct_.reset();  // waits for its writes while direct_data_ still holds their memory
}

void H5File::close() {
  if (!file_.valid()) return;
  silence_hdf5();
  hid_t id = file_.release();
  if (H5Fflush(id, H5F_SCOPE_LOCAL) < 0) {
    std::string stack = take_error_stack();
    H5Fclose(id);
    H5Eclear2(H5E_DEFAULT);
    throw Hdf5Error("HDF5: flush of " + path_ + " failed: " + stack);
  }
  if (H5Fclose(id) < 0) fail("close", "/");
  if (direct_) {
    direct_->finish();
    direct_.reset();
    direct_data_.clear();
  }
}

void H5File::fail(const std::string& what, const std::string& obj) const {
  std::string stack = take_error_stack();
  throw Hdf5Error("HDF5: " + what + " '" + obj + "' in " + path_ + " failed: " + stack);
}

void H5File::create_group(const std::string& name) {
  silence_hdf5();
  if (exists(name)) return;
  H5Id lcpl(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  H5Id g(H5Gcreate2(file_.get(), name.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!g.valid()) fail("create group", name);
}

bool H5File::exists(const std::string& name) const {
  silence_hdf5();
  std::string cur;
  for (const auto& part : split_path(name)) {
    cur += "/" + part;
    htri_t r = H5Lexists(file_.get(), cur.c_str(), H5P_DEFAULT);
    if (r < 0) fail("look up", cur);
    if (r == 0) return false;
  }
  return true;
}

std::vector<std::string> H5File::list_datasets(const std::string& group) const {
  silence_hdf5();
  H5Id g(H5Gopen2(file_.get(), group.c_str(), H5P_DEFAULT));
  if (!g.valid()) fail("open group", group);
  std::vector<std::string> names;
  auto cb = [](hid_t gid, const char* name, const H5L_info_t*, void* data) -> herr_t {
    H5Id o(H5Oopen(gid, name, H5P_DEFAULT));
    if (!o.valid()) return -1;
    if (H5Iget_type(o.get()) == H5I_DATASET) static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  hsize_t idx = 0;
  if (H5Literate(g.get(), H5_INDEX_NAME, H5_ITER_INC, &idx, cb, &names) < 0) fail("list", group);
  return names;
}

std::vector<KnownCrcRegion> H5File::checksummed_regions(uint64_t min_bytes) const {
  silence_hdf5();
  struct Walk {
    const H5File* file;
    uint64_t min_bytes;
    std::vector<KnownCrcRegion> out;
  } walk{this, min_bytes, {}};
  auto cb = [](hid_t root, const char* name, const H5O_info_t* info, void* data) -> herr_t {
    if (info->type != H5O_TYPE_DATASET) return 0;
    auto& w = *static_cast<Walk*>(data);
    H5Id ds(H5Dopen2(root, name, H5P_DEFAULT));
    if (!ds.valid()) return -1;
    const hsize_t bytes = H5Dget_storage_size(ds.get());
    const haddr_t offset = H5Dget_offset(ds.get());  // HADDR_UNDEF unless contiguous and allocated
    if (bytes < w.min_bytes || offset == HADDR_UNDEF || !w.file->has_attr(name, "crc32")) return 0;
    w.out.push_back({uint64_t(offset), uint64_t(bytes), uint32_t(w.file->attr_int(name, "crc32"))});
    return 0;
  };
  if (H5Ovisit2(file_.get(), H5_INDEX_NAME, H5_ITER_INC, cb, &walk, H5O_INFO_BASIC) < 0) fail("walk", "/");
  return walk.out;
}

std::string h5_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: throw Hdf5Error(std::string("HDF5: unsupported tensor dtype ") + c10::toString(t));
  }
}

void H5File::write_tensor(const std::string& name, const at::Tensor& t, bool checksum) {
  silence_hdf5();
  if (!t.defined()) throw Hdf5Error("HDF5: undefined tensor for dataset '" + name + "' in " + path_);
  StorageType st;
  try {
    st = storage_type(t.scalar_type());
  } catch (const Hdf5Error& e) {
    throw Hdf5Error(std::string(e.what()) + " for dataset '" + name + "' in " + path_);
  }
  at::Tensor c = t.detach().to(at::kCPU).contiguous();
  if (c.scalar_type() == at::kBool) c = c.to(at::kByte);

  std::vector<hsize_t> dims(c.sizes().begin(), c.sizes().end());
  H5Id space(c.dim() == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(int(dims.size()), dims.data(), nullptr));
  if (!space.valid()) fail("create dataspace for", name);
  H5Id lcpl(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  const size_t nbytes = size_t(c.numel()) * c.element_size();
  // Deferred (direct_data): the dataset's space is allocated now, contiguous and never filled by HDF5; the
  // background writer puts its bytes there with O_DIRECT, and close() waits for it.
  const bool defer = direct_ && c.dim() > 0 && nbytes >= kDirectDataMinBytes;
  H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE));
  if (defer && (H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS) < 0 ||
                H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY) < 0 ||
                H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER) < 0))
    fail("set the layout of", name);
  H5Id ds(H5Dcreate2(file_.get(), name.c_str(), st.file_type, space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT));
  if (!ds.valid()) fail("create dataset", name);
  if (c.numel() > 0 && !defer && H5Dwrite(ds.get(), st.mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, c.data_ptr()) < 0)
    fail("write dataset", name);
  const haddr_t offset = c.numel() > 0 ? H5Dget_offset(ds.get()) : HADDR_UNDEF;
  if (defer) {  // written in the background while the CRC below is computed
    if (offset == HADDR_UNDEF) fail("allocate the space of", name);
    direct_data_.push_back(c);
    direct_->add({uint64_t(offset), c.data_ptr(), uint64_t(nbytes)});
  }
  ds.reset();
  set_attr(name, "dtype", h5_dtype_name(t.scalar_type()));
  if (checksum) {
    const uint32_t crc = crc32_bytes(c.data_ptr(), nbytes);
    set_attr(name, "crc32", int64_t(crc));
    // Contiguous, unfiltered: the dataset's bytes lie in the file as they are in memory.
    if (offset != HADDR_UNDEF) written_.push_back({uint64_t(offset), uint64_t(nbytes), crc});
  }
}

H5TensorInfo H5File::tensor_info(const std::string& name) const {
  silence_hdf5();
  H5Id ds(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT));
  if (!ds.valid()) fail("open dataset", name);
  H5Id space(H5Dget_space(ds.get()));
  int nd = H5Sget_simple_extent_ndims(space.get());
  if (nd < 0) fail("read shape of", name);
  std::vector<hsize_t> dims(size_t(nd), 0);
  if (nd > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  H5TensorInfo info;
  info.shape.assign(dims.begin(), dims.end());
  H5Id type(H5Dget_type(ds.get()));
  try {
    if (has_attr(name, "dtype")) {  // ours: the attribute names the torch dtype, the stored type must fit it
      info.dtype = dtype_from_name(attr_string(name, "dtype"));
      H5T_class_t cls = H5Tget_class(type.get());
      bool ok = c10::elementSize(info.dtype) == H5Tget_size(type.get()) &&
                (cls == H5T_INTEGER || (cls == H5T_FLOAT && at::isFloatingType(info.dtype) &&
                                        info.dtype != at::kBFloat16));
      if (!ok)
        throw Hdf5Error("HDF5: dtype attribute '" + h5_dtype_name(info.dtype) + "' does not match the stored type");
    } else {
      info.dtype = dtype_from_h5type(type.get());
    }
  } catch (const Hdf5Error& e) {
    throw Hdf5Error(std::string(e.what()) + " for dataset '" + name + "' in " + path_);
  }
  return info;
}

void H5File::read_dataset(const std::string& name, const H5TensorInfo& info, void* buf, bool verify) const {
  H5Id ds(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT));
  if (!ds.valid()) fail("open dataset", name);
  int64_t numel = 1;
  for (int64_t d : info.shape) numel *= d;
  const size_t bytes = size_t(numel) * c10::elementSize(info.dtype == at::kBool ? at::kByte : info.dtype);
  bool have_crc = false;  // `crc` holds the CRC-32 of the bytes read (taken while reading)
  uint32_t crc = 0;
  if (numel > 0) {
    H5Id file_type(H5Dget_type(ds.get()));
    H5Id mem_type;
    if (info.dtype == at::kHalf && H5Tget_class(file_type.get()) == H5T_FLOAT) {
      mem_type = H5Id(H5Tget_native_type(file_type.get(), H5T_DIR_ASCEND));  // IEEE half written by another tool
    } else {
      mem_type = H5Id(H5Tcopy(storage_type(info.dtype).mem_type));
    }
    // A large contiguous dataset stored exactly as it is in memory (every tensor gmod writes): its bytes are read
    // straight from the file into buf, checksummed piece by piece as they arrive (read_file_region_crc), in
    // parallel ranges: one pass over memory instead of HDF5's read and then a second pass for the CRC.
    const haddr_t offset = H5Dget_offset(ds.get());  // HADDR_UNDEF unless contiguous and allocated
    if (bytes >= kDirectReadMinBytes && offset != HADDR_UNDEF && H5Tequal(file_type.get(), mem_type.get()) > 0 &&
        H5Dget_storage_size(ds.get()) == bytes) {
      try {
        crc = read_file_region_crc(path_, uint64_t(offset), bytes, buf);
      } catch (const std::exception& e) {
        throw Hdf5Error("HDF5: cannot read dataset '" + name + "': " + e.what());
      }
      have_crc = true;
    } else if (H5Dread(ds.get(), mem_type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
      fail("read dataset", name);
    }
  }
  ds.reset();
  if (verify && has_attr(name, "crc32")) {
    uint32_t want = uint32_t(attr_int(name, "crc32"));
    uint32_t got = have_crc ? crc : crc32_bytes(buf, bytes);
    if (want != got) {
      char msg[64];
      std::snprintf(msg, sizeof(msg), "stored %08x, computed %08x", want, got);
      const std::string what = "HDF5: checksum mismatch for dataset '" + name + "' in " + path_ + " (" + msg + ")";
      if (!crc_failures_) throw Hdf5Error(what);
      crc_failures_->push_back(what);
    }
  }
}

at::Tensor H5File::read_tensor(const std::string& name, bool verify) const {
  H5TensorInfo info = tensor_info(name);
  at::ScalarType buf_type = info.dtype == at::kBool ? at::kByte : info.dtype;
  at::Tensor out = at::empty(info.shape, at::TensorOptions().dtype(buf_type));
  read_dataset(name, info, out.data_ptr(), verify);
  return info.dtype == at::kBool ? out.ne(0) : out;
}

void H5File::read_tensor_into(const std::string& name, at::Tensor dst, bool verify) const {
  H5TensorInfo info = tensor_info(name);
  int64_t numel = 1;
  for (int64_t d : info.shape) numel *= d;
  if (numel != dst.numel())
    throw Hdf5Error("HDF5: dataset '" + name + "' in " + path_ + " has " + std::to_string(numel) +
                    " elements, the tensor it is read into " + std::to_string(dst.numel()));
  if (dst.device().is_cpu() && dst.is_contiguous() && dst.scalar_type() == info.dtype && info.dtype != at::kBool) {
    c10::NoGradGuard no_grad;
    read_dataset(name, info, dst.data_ptr(), verify);
    return;
  }
  c10::NoGradGuard no_grad;
  dst.copy_(read_tensor(name, verify).reshape(dst.sizes()));
}

// ---------------------------------------------------------------------------------------------------- attributes

void H5File::write_attr(const std::string& obj, const std::string& key, hid_t file_type, hid_t mem_type,
                        const void* buf) {
  silence_hdf5();
  const char* o = obj.c_str();
  htri_t ex = H5Aexists_by_name(file_.get(), o, key.c_str(), H5P_DEFAULT);
  if (ex < 0) fail("look up attribute " + key + " of", obj);
  if (ex > 0 && H5Adelete_by_name(file_.get(), o, key.c_str(), H5P_DEFAULT) < 0)
    fail("replace attribute " + key + " of", obj);
  H5Id space(H5Screate(H5S_SCALAR));
  H5Id a(H5Acreate_by_name(file_.get(), o, key.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                           H5P_DEFAULT));
  if (!a.valid()) fail("create attribute " + key + " of", obj);
  if (H5Awrite(a.get(), mem_type, buf) < 0) fail("write attribute " + key + " of", obj);
}

void H5File::set_attr(const std::string& obj, const std::string& key, const std::string& value) {
  H5Id st = vlen_string_type();
  const char* p = value.c_str();
  write_attr(obj, key, st.get(), st.get(), &p);
}

void H5File::set_attr(const std::string& obj, const std::string& key, int64_t value) {
  write_attr(obj, key, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}

void H5File::set_attr(const std::string& obj, const std::string& key, double value) {
  write_attr(obj, key, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

void H5File::set_json_attr(const std::string& obj, const std::string& key, const nlohmann::json& value) {
  set_attr(obj, key, value.dump());
}

bool H5File::has_attr(const std::string& obj, const std::string& key) const {
  silence_hdf5();
  htri_t ex = H5Aexists_by_name(file_.get(), obj.c_str(), key.c_str(), H5P_DEFAULT);
  if (ex < 0) fail("look up attribute " + key + " of", obj);
  return ex > 0;
}

H5Id H5File::open_attr(const std::string& obj, const std::string& key) const {
  silence_hdf5();
  H5Id a(H5Aopen_by_name(file_.get(), obj.c_str(), key.c_str(), H5P_DEFAULT, H5P_DEFAULT));
  if (!a.valid()) fail("open attribute " + key + " of", obj);
  return a;
}

std::string H5File::attr_string(const std::string& obj, const std::string& key) const {
  H5Id a = open_attr(obj, key);
  H5Id type(H5Aget_type(a.get()));
  if (H5Tget_class(type.get()) != H5T_STRING)
    throw Hdf5Error("HDF5: attribute " + key + " of '" + obj + "' in " + path_ + " is not a string");
  H5Id space(H5Aget_space(a.get()));
  if (H5Sget_simple_extent_npoints(space.get()) != 1)
    throw Hdf5Error("HDF5: attribute " + key + " of '" + obj + "' in " + path_ + " is not a scalar string");
  if (H5Tis_variable_str(type.get()) > 0) {
    H5Id mem = vlen_string_type();
    char* p = nullptr;
    if (H5Aread(a.get(), mem.get(), &p) < 0) fail("read attribute " + key + " of", obj);
    std::string s = p ? p : "";
    if (p) H5free_memory(p);
    return s;
  }
  size_t n = H5Tget_size(type.get());
  H5Id mem(H5Tcopy(H5T_C_S1));
  H5Tset_size(mem.get(), n);
  std::string s(n, '\0');
  if (H5Aread(a.get(), mem.get(), s.data()) < 0) fail("read attribute " + key + " of", obj);
  s.resize(std::strlen(s.c_str()));
  return s;
}

int64_t H5File::attr_int(const std::string& obj, const std::string& key) const {
  H5Id a = open_attr(obj, key);
  H5Id type(H5Aget_type(a.get()));
  if (H5Tget_class(type.get()) != H5T_INTEGER)
    throw Hdf5Error("HDF5: attribute " + key + " of '" + obj + "' in " + path_ + " is not an integer");
  int64_t v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_INT64, &v) < 0) fail("read attribute " + key + " of", obj);
  return v;
}

double H5File::attr_double(const std::string& obj, const std::string& key) const {
  H5Id a = open_attr(obj, key);
  H5Id type(H5Aget_type(a.get()));
  H5T_class_t cls = H5Tget_class(type.get());
  if (cls != H5T_FLOAT && cls != H5T_INTEGER)
    throw Hdf5Error("HDF5: attribute " + key + " of '" + obj + "' in " + path_ + " is not a number");
  double v = 0;
  if (H5Aread(a.get(), H5T_NATIVE_DOUBLE, &v) < 0) fail("read attribute " + key + " of", obj);
  return v;
}

nlohmann::json H5File::attr_json(const std::string& obj, const std::string& key) const {
  std::string s = attr_string(obj, key);
  try {
    return nlohmann::json::parse(s);
  } catch (const nlohmann::json::exception& e) {
    throw Hdf5Error("HDF5: attribute " + key + " of '" + obj + "' in " + path_ + " is not valid JSON: " + e.what());
  }
}

}  // namespace gmod

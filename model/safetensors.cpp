// safetensors reader (mmap) / writer (atomic). See safetensors.h.
#include "model/safetensors.h"

#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "model/posix_path.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors I/O assumes a little-endian host"
#endif

namespace gmod {
using json = nlohmann::json;

namespace {

constexpr uint64_t kMaxHeader = 100000000;  // as the Rust reference (MAX_HEADER_SIZE)

struct DtypeDesc {
  const char* name;
  int bits;
  at::ScalarType type;  // Undefined: in the safetensors spec but not supported here
};

// Every dtype of the safetensors spec (safetensors/src/tensor.rs `Dtype`).
const DtypeDesc kDtypes[] = {
    {"BOOL", 8, at::kBool},          {"U8", 8, at::kByte},
    {"I8", 8, at::kChar},            {"I16", 16, at::kShort},
    {"I32", 32, at::kInt},           {"I64", 64, at::kLong},
    {"F16", 16, at::kHalf},          {"BF16", 16, at::kBFloat16},
    {"F32", 32, at::kFloat},         {"F64", 64, at::kDouble},
    {"U16", 16, at::ScalarType::Undefined},      {"U32", 32, at::ScalarType::Undefined},
    {"U64", 64, at::ScalarType::Undefined},      {"F8_E5M2", 8, at::ScalarType::Undefined},
    {"F8_E4M3", 8, at::ScalarType::Undefined},   {"F8_E8M0", 8, at::ScalarType::Undefined},
    {"F6_E2M3", 6, at::ScalarType::Undefined},   {"F6_E3M2", 6, at::ScalarType::Undefined},
    {"F4", 4, at::ScalarType::Undefined},        {"C64", 64, at::ScalarType::Undefined},
};

const DtypeDesc* find_dtype(const std::string& s) {
  for (const auto& d : kDtypes)
    if (s == d.name) return &d;
  return nullptr;
}

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error("safetensors: " + path + ": " + what);
}
[[noreturn]] void fail_t(const std::string& path, const std::string& name, const std::string& what) {
  throw std::runtime_error("safetensors: " + path + ": tensor '" + name + "': " + what);
}

std::string errno_str() { return std::strerror(errno); }

using posix_path::is_dir;
using posix_path::join;
using posix_path::parent_dir;

void mkdir_p(const std::string& dir) {
  if (dir.empty() || is_dir(dir)) return;
  std::string up = parent_dir(dir);
  if (up != dir && up != "." && up != "/") mkdir_p(up);
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) fail(dir, "cannot create directory: " + errno_str());
}

}  // namespace

int64_t SafetensorsInfo::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

struct SafetensorsFile::Mapping {
  void* addr = nullptr;
  size_t len = 0;
  ~Mapping() {
    if (addr && addr != MAP_FAILED) ::munmap(addr, len);
  }
};

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open: " + errno_str());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    errno = e;
    fail(path, "cannot stat: " + errno_str());
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "not a regular file");
  }
  file_size_ = static_cast<uint64_t>(st.st_size);
  if (file_size_ < 8) {
    ::close(fd);
    fail(path, "file is " + std::to_string(file_size_) + " bytes, shorter than the 8-byte header length (truncated?)");
  }
  map_ = std::make_shared<Mapping>();
  map_->len = file_size_;
  map_->addr = ::mmap(nullptr, file_size_, PROT_READ, MAP_SHARED, fd, 0);
  int map_errno = errno;
  ::close(fd);  // the mapping keeps the file referenced
  if (map_->addr == MAP_FAILED) {
    map_->addr = nullptr;
    errno = map_errno;
    fail(path, "mmap failed: " + errno_str());
  }
  const auto* base = static_cast<const uint8_t*>(map_->addr);

  uint64_t n = 0;
  std::memcpy(&n, base, 8);  // little-endian host
  if (n > kMaxHeader)
    fail(path, "header length " + std::to_string(n) + " exceeds the limit of " + std::to_string(kMaxHeader) + " bytes");
  if (n > file_size_ - 8)
    fail(path, "header length " + std::to_string(n) + " goes beyond the end of the file (" +
                   std::to_string(file_size_) + " bytes; truncated?)");
  data_start_ = 8 + n;
  const uint64_t buffer_size = file_size_ - data_start_;
  const char* hbeg = reinterpret_cast<const char*>(base + 8);
  if (n == 0 || hbeg[0] != '{') fail(path, "header does not start with '{' (not a safetensors file?)");

  // Parse, recording top-level keys to detect duplicates (nlohmann keeps the last silently).
  std::vector<std::string> dup_keys;
  std::set<std::string> seen;
  json header;
  try {
    header = json::parse(hbeg, hbeg + n, [&](int depth, json::parse_event_t ev, json& parsed) {
      if (depth == 1 && ev == json::parse_event_t::key) {
        auto k = parsed.get<std::string>();
        if (!seen.insert(k).second) dup_keys.push_back(k);
      }
      return true;
    });
  } catch (const json::exception& e) {
    fail(path, std::string("malformed header JSON: ") + e.what());
  }
  if (!header.is_object()) fail(path, "header JSON is not an object");
  if (!dup_keys.empty()) fail_t(path, dup_keys.front(), "duplicate entry in header");

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail(path, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m->is_string()) fail(path, "__metadata__ value of '" + m.key() + "' is not a string");
        metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) fail_t(path, name, "header entry is not an object");
    SafetensorsInfo info;
    // dtype
    auto d = v.find("dtype");
    if (d == v.end() || !d->is_string()) fail_t(path, name, "missing or non-string \"dtype\"");
    info.dtype = d->get<std::string>();
    const DtypeDesc* desc = find_dtype(info.dtype);
    if (!desc) fail_t(path, name, "unsupported dtype " + info.dtype + " (unknown to the safetensors format)");
    info.scalar_type = desc->type;
    // shape
    auto s = v.find("shape");
    if (s == v.end() || !s->is_array()) fail_t(path, name, "missing or non-array \"shape\"");
    uint64_t numel = 1;
    bool overflow = false;
    for (const auto& e : *s) {
      if (!e.is_number_unsigned()) fail_t(path, name, "shape " + s->dump() + " has a non-integer or negative entry");
      uint64_t dim = e.get<uint64_t>();
      if (dim > static_cast<uint64_t>(INT64_MAX)) fail_t(path, name, "shape " + s->dump() + " entry too large");
      info.shape.push_back(static_cast<int64_t>(dim));
      overflow |= __builtin_mul_overflow(numel, dim, &numel);
    }
    uint64_t nbits = 0;
    overflow |= __builtin_mul_overflow(numel, static_cast<uint64_t>(desc->bits), &nbits);
    if (overflow) fail_t(path, name, "shape " + s->dump() + " overflows the byte size");
    if (nbits % 8 != 0)
      fail_t(path, name, "shape " + s->dump() + " with dtype " + info.dtype + " is not a whole number of bytes");
    // offsets
    auto o = v.find("data_offsets");
    if (o == v.end() || !o->is_array() || o->size() != 2 || !(*o)[0].is_number_unsigned() ||
        !(*o)[1].is_number_unsigned())
      fail_t(path, name, "\"data_offsets\" must be [begin, end] of non-negative integers");
    info.begin = (*o)[0].get<uint64_t>();
    info.end = (*o)[1].get<uint64_t>();
    const std::string offs = "data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) + "]";
    if (info.begin > info.end) fail_t(path, name, offs + ": begin > end");
    if (info.end > buffer_size)
      fail_t(path, name, offs + " out of range: the byte buffer has only " + std::to_string(buffer_size) +
                             " bytes (file truncated or offsets corrupt)");
    if (info.end - info.begin != nbits / 8)
      fail_t(path, name, offs + " span " + std::to_string(info.end - info.begin) + " bytes but dtype " + info.dtype +
                             " shape " + s->dump() + " needs " + std::to_string(nbits / 8));
    entries_.emplace(name, std::move(info));
  }

  // Coverage: sorted by offsets the ranges must tile [0, buffer_size) exactly.
  std::vector<std::pair<const std::string*, const SafetensorsInfo*>> sorted;
  for (const auto& kv : entries_) sorted.emplace_back(&kv.first, &kv.second);
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    if (a.second->begin != b.second->begin) return a.second->begin < b.second->begin;
    if (a.second->end != b.second->end) return a.second->end < b.second->end;
    return *a.first < *b.first;
  });
  uint64_t pos = 0;
  const std::string* prev = nullptr;
  for (const auto& [name, info] : sorted) {
    if (info->begin < pos)
      fail_t(path, *name, "data_offsets [" + std::to_string(info->begin) + ", " + std::to_string(info->end) +
                              "] overlap tensor '" + *prev + "' (which ends at " + std::to_string(pos) + ")");
    if (info->begin > pos)
      fail_t(path, *name, "MetadataIncompleteBuffer: bytes [" + std::to_string(pos) + ", " +
                              std::to_string(info->begin) + ") before this tensor belong to no tensor");
    pos = info->end;
    prev = name;
  }
  if (pos != buffer_size)
    fail(path, "MetadataIncompleteBuffer: the byte buffer has " + std::to_string(buffer_size) +
                   " bytes but the tensors cover only " + std::to_string(pos) + " (trailing bytes)");
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& kv : entries_) out.push_back(kv.first);
  std::sort(out.begin(), out.end());
  return out;
}

const SafetensorsInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) fail_t(path_, name, "no such tensor in the file");
  return it->second;
}

at::Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsInfo& in = info(name);
  if (in.scalar_type == at::ScalarType::Undefined) fail_t(path_, name, "unsupported dtype " + in.dtype);
  auto opts = at::TensorOptions().dtype(in.scalar_type).device(at::kCPU);
  if (in.nbytes() == 0) return at::empty(in.shape, opts);
  auto* ptr = static_cast<uint8_t*>(map_->addr) + data_start_ + in.begin;
  const size_t item = at::elementSize(in.scalar_type);
  auto keep = map_;
  at::Tensor view = at::from_blob(ptr, in.shape, [keep](void*) {}, opts);
  if (reinterpret_cast<uintptr_t>(ptr) % item != 0) return view.clone();  // misaligned: own aligned copy
  return view;
}

// ---------------------------------------------------------------------------------------------------------------

std::string safetensors_dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t && t != at::ScalarType::Undefined) return d.name;
  throw std::runtime_error(std::string("safetensors: unsupported dtype ") + c10::toString(t));
}

namespace {

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t(1) << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(path, "write failed: " + errno_str());
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// Writes `bytes` produced by `body(fd)` to path + ".tmp", fsyncs, renames over `path`.
template <class F>
void atomic_write(const std::string& path, F&& body) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(tmp, "cannot create: " + errno_str());
  try {
    body(fd, tmp);
    if (::fsync(fd) != 0) fail(tmp, "fsync failed: " + errno_str());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    fail(tmp, "close failed: " + errno_str());
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    errno = e;
    fail(path, "rename from " + tmp + " failed: " + errno_str());
  }
  fsync_dir(parent_dir(path));
}

}  // namespace

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& m = header["__metadata__"] = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
  }
  std::set<std::string> seen;
  uint64_t off = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") fail_t(path, name, "reserved name");
    if (!seen.insert(name).second) fail_t(path, name, "duplicate tensor name");
    if (!t.defined()) fail_t(path, name, "undefined tensor");
    if (t.layout() != at::kStrided) fail_t(path, name, "only dense (strided) tensors can be saved");
    std::string dt;
    try {
      dt = safetensors_dtype_name(t.scalar_type());
    } catch (const std::exception&) {
      fail_t(path, name, std::string("unsupported dtype ") + c10::toString(t.scalar_type()));
    }
    const uint64_t nbytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", dt}, {"shape", t.sizes().vec()}, {"data_offsets", {off, off + nbytes}}};
    off += nbytes;
  }
  std::string h;
  try {
    h = header.dump();
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("cannot serialise header (tensor names must be valid UTF-8): ") + e.what());
  }
  h.append((8 - h.size() % 8) % 8, ' ');
  if (h.size() > kMaxHeader) fail(path, "header of " + std::to_string(h.size()) + " bytes exceeds the limit");
  atomic_write(path, [&](int fd, const std::string& tmp) {
    const uint64_t n = h.size();
    write_all(fd, &n, 8, tmp);
    write_all(fd, h.data(), h.size(), tmp);
    for (const auto& [name, t] : tensors) {
      if (t.numel() == 0) continue;
      at::Tensor c = t.detach().to(at::kCPU).contiguous();
      write_all(fd, c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size(), tmp);
    }
  });
}

std::vector<std::string> save_safetensors_sharded(const std::string& dir,
                                                  const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                                  uint64_t max_shard_bytes,
                                                  const std::map<std::string, std::string>& metadata) {
  mkdir_p(dir);
  // Greedy grouping in insertion order.
  std::vector<std::vector<size_t>> groups;
  uint64_t cur = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i].second;
    const uint64_t nb = t.defined() ? static_cast<uint64_t>(t.numel()) * t.element_size() : 0;
    if (groups.empty() || (!groups.back().empty() && cur + nb > max_shard_bytes)) {
      groups.emplace_back();
      cur = 0;
    }
    groups.back().push_back(i);
    cur += nb;
    total += nb;
  }
  if (groups.empty()) groups.emplace_back();
  const size_t n = groups.size();
  auto shard_name = [n](size_t k) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k + 1, n);
    return std::string(buf);
  };
  std::vector<std::string> out;
  json weight_map = json::object();
  for (size_t k = 0; k < n; ++k) {
    std::vector<std::pair<std::string, at::Tensor>> part;
    for (size_t i : groups[k]) {
      part.push_back(tensors[i]);
      if (weight_map.contains(tensors[i].first))
        fail_t(join(dir, shard_name(k)), tensors[i].first, "duplicate tensor name");
      weight_map[tensors[i].first] = shard_name(k);
    }
    save_safetensors(join(dir, shard_name(k)), part, metadata);
    out.push_back(shard_name(k));
  }
  json index;
  index["metadata"] = json::object();
  for (const auto& [k, v] : metadata) index["metadata"][k] = v;
  index["metadata"]["total_size"] = total;
  index["weight_map"] = weight_map;
  const std::string text = index.dump(2) + "\n";
  const std::string ipath = join(dir, "model.safetensors.index.json");
  atomic_write(ipath, [&](int fd, const std::string& tmp) { write_all(fd, text.data(), text.size(), tmp); });
  return out;
}

void copy_into(at::Tensor& dst, const at::Tensor& src, const std::string& name, const std::string& file) {
  if (!dst.defined() || !src.defined()) fail_t(file, name, "copy_into with an undefined tensor");
  if (!dst.sizes().equals(src.sizes()))
    fail_t(file, name, "shape mismatch: expected " + shape_str(dst.sizes()) + ", checkpoint has " +
                           shape_str(src.sizes()));
  if (dst.scalar_type() != src.scalar_type() &&
      at::isFloatingType(dst.scalar_type()) != at::isFloatingType(src.scalar_type()))
    fail_t(file, name, std::string("dtype mismatch: destination ") + c10::toString(dst.scalar_type()) +
                           ", checkpoint " + c10::toString(src.scalar_type()) + " (no float <-> integer conversion)");
  at::NoGradGuard guard;
  dst.copy_(src);
}

}  // namespace gmod

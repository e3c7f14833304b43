// File CRC-32s for checkpoints; see file_crc.h.
#include "trainer/checkpoint/file_crc.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "trainer/checkpoint/crc32.h"
#include "trainer/checkpoint/unique_fd.h"

namespace gmod {
namespace {

uint64_t open_sized(const std::string& path, UniqueFd& f) {
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw std::runtime_error("cannot stat " + path + ": " + std::strerror(errno));
  return uint64_t(st.st_size);
}

// CRC-32 of [begin, end) of fd; 0 errno on success, else the error (EIO when the file ends early).
int crc_range(int fd, uint64_t begin, uint64_t end, std::vector<unsigned char>& buf, uint32_t* crc_out) {
  uint32_t crc = 0;
  for (uint64_t off = begin; off < end;) {
    const ssize_t n = ::pread(fd, buf.data(), size_t(std::min<uint64_t>(buf.size(), end - off)), off_t(off));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : EIO;  // a file shorter than its fstat size: truncated under us
    crc = crc32_bytes(buf.data(), size_t(n), crc);
    off += uint64_t(n);
  }
  *crc_out = crc;
  return 0;
}

// Reads [begin, end) of fd into dst + (begin - base) in pieces of `piece` bytes, the CRC-32 of each piece taken while it
// is in cache; 0 on success, else the errno (EIO when the file ends early).
int read_crc_range(int fd, uint64_t base, uint64_t begin, uint64_t end, unsigned char* dst, uint32_t* crc_out) {
  constexpr uint64_t kPiece = uint64_t(1) << 20;
  uint32_t crc = 0;
  for (uint64_t off = begin; off < end;) {
    unsigned char* p = dst + (off - base);
    const ssize_t n = ::pread(fd, p, size_t(std::min<uint64_t>(kPiece, end - off)), off_t(off));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : EIO;
    crc = crc32_bytes(p, size_t(n), crc);
    off += uint64_t(n);
  }
  *crc_out = crc;
  return 0;
}

// The descriptor range i of a parallel read goes through: `shared` for range 0, its own open file (kept in
// `own`) for the others, since the kernel keeps read-ahead state per open file and ranges interleaving on one
// descriptor look like random reads to it (a file not in the page cache was read at a third of the disk's
// speed: issue 47, 0.37 GB/s for a 1-rank optimizer state against 1.1 GB/s for the weights, read in one range
// each). Advised sequential over [begin, end). -1 with errno set when the open fails.
int range_fd(const std::string& path, uint64_t i, int shared, UniqueFd& own, uint64_t begin, uint64_t end) {
  int fd = shared;
  if (i > 0) {
    own.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (own.fd < 0) return -1;
    fd = own.fd;
  }
  ::posix_fadvise(fd, off_t(begin), off_t(end - begin), POSIX_FADV_SEQUENTIAL);
  return fd;
}

}  // namespace

uint32_t read_file_region_crc(const std::string& path, uint64_t offset, uint64_t bytes, void* dst) {
  UniqueFd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  // Ranges of >= 32 MiB, one thread each (through its own open file: range_fd): a single reader copies from
  // the page cache at one core's speed.
  constexpr uint64_t kMinRange = uint64_t(32) << 20;
  const uint64_t cores = std::max(1u, std::thread::hardware_concurrency());
  const uint64_t parts = std::max<uint64_t>(1, std::min<uint64_t>({8, cores, bytes / kMinRange}));
  std::vector<uint32_t> crcs(parts, 0);
  std::vector<int> errs(parts, 0);
  auto* out = static_cast<unsigned char*>(dst);
  auto bound = [&](uint64_t i) { return offset + bytes * i / parts; };
  auto run = [&](uint64_t i) {
    UniqueFd own;
    const int fd = range_fd(path, i, f.fd, own, bound(i), bound(i + 1));
    errs[i] = fd < 0 ? errno : read_crc_range(fd, offset, bound(i), bound(i + 1), out, &crcs[i]);
  };
  std::vector<std::thread> pool;
  for (uint64_t i = 1; i < parts; ++i) pool.emplace_back(run, i);
  run(0);
  for (auto& t : pool) t.join();
  uint32_t crc = 0;
  for (uint64_t i = 0; i < parts; ++i) {
    if (errs[i])
      throw std::runtime_error("cannot read " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                               " of " + path + ": " + std::strerror(errs[i]));
    crc = i == 0 ? crcs[0] : uint32_t(::crc32_combine(crc, crcs[i], z_off_t(bound(i + 1) - bound(i))));
  }
  return crc;
}

// Split into at most 8 contiguous ranges of >= 64 MiB, one thread each (pread), joined with crc32_combine: the
// same CRC as one sequential pass, several times faster on a file still in the page cache.
uint32_t crc32_file(const std::string& path, uint64_t* size_out) {
  UniqueFd f;
  const uint64_t size = open_sized(path, f);
  constexpr uint64_t kMinRange = uint64_t(64) << 20;
  const uint64_t cores = std::max(1u, std::thread::hardware_concurrency());
  const uint64_t parts = std::max<uint64_t>(1, std::min<uint64_t>({8, cores, size / kMinRange}));
  std::vector<uint32_t> crcs(parts, 0);
  std::vector<int> errs(parts, 0);
  auto run = [&](uint64_t i) {  // each range through its own open file (range_fd)
    const uint64_t begin = size * i / parts, end = size * (i + 1) / parts;
    UniqueFd own;
    const int fd = range_fd(path, i, f.fd, own, begin, end);
    std::vector<unsigned char> buf(size_t(8) << 20);
    errs[i] = fd < 0 ? errno : crc_range(fd, begin, end, buf, &crcs[i]);
  };
  std::vector<std::thread> pool;
  for (uint64_t i = 1; i < parts; ++i) pool.emplace_back(run, i);
  run(0);
  for (auto& t : pool) t.join();
  uint32_t crc = 0;
  for (uint64_t i = 0; i < parts; ++i) {
    if (errs[i]) throw std::runtime_error("cannot read " + path + ": " + std::strerror(errs[i]));
    const uint64_t len = size * (i + 1) / parts - size * i / parts;
    crc = i == 0 ? crcs[0] : uint32_t(::crc32_combine(crc, crcs[i], z_off_t(len)));
  }
  if (size_out) *size_out = size;
  return crc;
}

uint32_t crc32_file_with_known(const std::string& path, std::vector<KnownCrcRegion> known, uint64_t* size_out,
                               bool* used_regions) {
  UniqueFd f;
  const uint64_t size = open_sized(path, f);
  std::sort(known.begin(), known.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  known.erase(std::remove_if(known.begin(), known.end(), [](const auto& r) { return r.bytes == 0; }), known.end());
  uint64_t pos = 0;
  bool ok = true;
  for (const auto& r : known) {
    if (r.offset < pos || r.offset + r.bytes > size) ok = false;
    pos = r.offset + r.bytes;
  }
  if (used_regions) *used_regions = ok;
  if (!ok) return crc32_file(path, size_out);
  std::vector<unsigned char> buf(size_t(1) << 20);
  uint32_t crc = 0;
  pos = 0;
  auto append_gap = [&](uint64_t end) {
    if (end <= pos) return;
    uint32_t g = 0;
    if (int e = crc_range(f.fd, pos, end, buf, &g))
      throw std::runtime_error("cannot read " + path + ": " + std::strerror(e));
    crc = uint32_t(::crc32_combine(crc, g, z_off_t(end - pos)));
  };
  for (const auto& r : known) {
    append_gap(r.offset);
    crc = uint32_t(::crc32_combine(crc, r.crc, z_off_t(r.bytes)));
    pos = r.offset + r.bytes;
  }
  append_gap(size);
  if (size_out) *size_out = size;
  return crc;
}

}  // namespace gmod

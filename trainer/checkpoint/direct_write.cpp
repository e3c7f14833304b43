// O_DIRECT region writes through an aligned bounce buffer; see direct_write.h.
#include "trainer/checkpoint/direct_write.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <stdexcept>

#include "trainer/checkpoint/unique_fd.h"

namespace gmod {
namespace {

constexpr uint64_t kDirectAlign = 4096;    // O_DIRECT alignment of offsets, lengths and memory
constexpr uint64_t kChunk = 16ull << 20;   // bounce buffer

void pwrite_all(int fd, const char* p, uint64_t n, uint64_t off, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      throw std::runtime_error("checkpoint: write of " + std::to_string(n) + " bytes at offset " +
                               std::to_string(off) + " of " + path + " failed: " +
                               (w < 0 ? std::strerror(errno) : "wrote nothing"));
    p += w, n -= uint64_t(w), off += uint64_t(w);
  }
}

}  // namespace

DirectWriteStats write_regions_direct(const std::string& path, const std::vector<DirectRegion>& regions) {
  DirectWriteStats stats;
  if (regions.empty()) return stats;
  UniqueFd buffered, direct;
  buffered.fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (buffered.fd < 0)
    throw std::runtime_error("checkpoint: cannot open " + path + " for writing: " + std::strerror(errno));
  direct.fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT);  // EINVAL where the file system has none
  // Two bounce buffers: the next chunk is copied while the previous one is being written.
  std::unique_ptr<char, decltype(&std::free)> bounce[2] = {{nullptr, &std::free}, {nullptr, &std::free}};
  if (direct.fd >= 0)
    for (auto& b : bounce) {
      void* p = nullptr;
      if (posix_memalign(&p, kDirectAlign, kChunk) != 0) throw std::bad_alloc();
      b.reset(static_cast<char*>(p));
    }
  std::future<void> writing[2];
  size_t next = 0;
  for (const DirectRegion& r : regions) {
    const char* src = static_cast<const char*>(r.data);
    uint64_t body = 0;  // bytes written with O_DIRECT from the region's start
    if (direct.fd >= 0 && r.offset % kDirectAlign == 0) body = r.bytes / kDirectAlign * kDirectAlign;
    for (uint64_t done = 0; done < body; next ^= 1) {
      const uint64_t n = std::min(kChunk, body - done);
      if (writing[next].valid()) writing[next].get();  // its buffer is free again (rethrows its error)
      std::memcpy(bounce[next].get(), src + done, n);
      writing[next] = std::async(std::launch::async, pwrite_all, direct.fd, bounce[next].get(), n, r.offset + done,
                                 std::cref(path));
      done += n;
    }
    if (body < r.bytes) pwrite_all(buffered.fd, src + body, r.bytes - body, r.offset + body, path);
    stats.direct_bytes += body;
    stats.buffered_bytes += r.bytes - body;
  }
  for (auto& w : writing)
    if (w.valid()) w.get();
  return stats;
}

BackgroundRegionWriter::BackgroundRegionWriter(std::string path)
    : path_(std::move(path)), thread_([this] { run(); }) {}

BackgroundRegionWriter::~BackgroundRegionWriter() {
  try {
    finish();
  } catch (...) {
  }
}

void BackgroundRegionWriter::add(const DirectRegion& r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(r);
  }
  cv_.notify_one();
}

void BackgroundRegionWriter::run() {
  for (;;) {
    DirectRegion r;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return closing_ || !queue_.empty(); });
      if (queue_.empty()) return;  // closing, nothing left
      r = queue_.front();
    }
    std::string err;
    DirectWriteStats st;
    if (error_.empty()) {  // after an error the rest is skipped (the file is abandoned)
      try {
        st = write_regions_direct(path_, {r});
      } catch (const std::exception& e) {
        err = e.what();
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    queue_.pop_front();
    stats_.direct_bytes += st.direct_bytes;
    stats_.buffered_bytes += st.buffered_bytes;
    if (error_.empty()) error_ = err;
  }
}

DirectWriteStats BackgroundRegionWriter::finish() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  if (!error_.empty()) throw std::runtime_error(error_);
  return stats_;
}

}  // namespace gmod

// AsyncCheckpointSave: see async_save.h.
#include "trainer/checkpoint/async_save.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <exception>
#include <stdexcept>
#include <string>

#include "parallel/pinned_host.h"

namespace gmod {

namespace {
// This thread only (Linux: nice and I/O priority are per thread; threads it starts inherit them). Best effort: a
// refusal leaves the default priority.
void lower_this_thread_priority() {
  const auto tid = pid_t(::syscall(SYS_gettid));
  errno = 0;
  const int now = ::getpriority(PRIO_PROCESS, id_t(tid));
  if (errno == 0) (void)::setpriority(PRIO_PROCESS, id_t(tid), std::min(now + 10, 19));
  constexpr int kWhoProcess = 1, kClassBestEffort = 2, kClassShift = 13;  // linux/ioprio.h
  (void)::syscall(SYS_ioprio_set, kWhoProcess, tid, (kClassBestEffort << kClassShift) | 7);
}
}  // namespace

AsyncCheckpointSave::AsyncCheckpointSave(CheckpointWriter writer, CheckpointContent content, RankState mine,
                                         bool background_priority)
    : writer_(std::move(writer)), content_(std::move(content)), mine_(std::move(mine)) {
  thread_ = std::thread([this, background_priority] {
    if (background_priority) lower_this_thread_priority();
    const auto t0 = std::chrono::steady_clock::now();
    try {
      writer_.write_files(content_, mine_);
    } catch (const std::exception& e) {
      error_ = e.what();
    } catch (...) {
      error_ = "unknown exception";
    }
    write_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // The host copies are not needed any more: freed here, not when the trainer next looks.
    mine_.tensors.clear();
    content_.model.clear();
    done_.store(true, std::memory_order_release);
  });
}

AsyncCheckpointSave::~AsyncCheckpointSave() {
  if (thread_.joinable()) thread_.join();
}

void AsyncCheckpointSave::wait() {
  if (thread_.joinable()) thread_.join();
}

namespace {
constexpr int64_t kAlign = 64;  // every copy starts on a cache line (and any vector width)
int64_t aligned(int64_t b) { return (b + kAlign - 1) / kAlign * kAlign; }
}  // namespace

void SnapshotArena::begin(const std::vector<int64_t>& tensor_bytes, bool pinned) {
  int64_t need = 0;
  for (int64_t b : tensor_bytes) need += aligned(b);
  if (need > capacity_bytes()) {
    buf_ = at::Tensor();  // the old buffer is freed before the new one is made: never both at once
    buf_ = host_empty(need, at::kByte, pinned, "the asynchronous checkpoint's host snapshot (checkpoint.async)");
  }
  used_ = 0;
}

void SnapshotArena::touch() {
  if (buf_.defined()) buf_.zero_();
}

at::Tensor SnapshotArena::take(const at::Tensor& t) {
  const int64_t bytes = t.numel() * int64_t(t.element_size());
  if (used_ + bytes > capacity_bytes())
    throw std::logic_error("checkpoint: the snapshot arena holds " + std::to_string(capacity_bytes()) +
                           " bytes, fewer than the snapshot's tensors need (begin() was given too few)");
  at::Tensor h = buf_.narrow(0, used_, bytes).view(t.scalar_type()).view(t.sizes());
  h.copy_(t.detach());
  used_ = aligned(used_ + bytes);
  return h;
}

int64_t snapshot_bytes(const NamedTensors& ts) {
  int64_t b = 0;
  for (const auto& [n, t] : ts) b += t.numel() * int64_t(t.element_size());
  return b;
}

}  // namespace gmod

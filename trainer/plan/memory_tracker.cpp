#include "trainer/plan/memory_tracker.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <atomic>
#include <mutex>

namespace gmod {
namespace {

// Each block is [header | data]: the header keeps the requested size so the deleter can uncount it without a
// map. 64 bytes keep c10's 64-byte alignment of the data. The context is the data pointer itself (a "simple"
// DataPtr, which raw_allocate() requires), and the deleter finds the header just before it.
constexpr size_t kHeader = 64;

std::atomic<int64_t> g_live{0}, g_peak{0}, g_count{0};

void raise_peak(int64_t live) {
  int64_t p = g_peak.load(std::memory_order_relaxed);
  while (live > p && !g_peak.compare_exchange_weak(p, live, std::memory_order_relaxed)) {
  }
}

void tracked_delete(void* data) {
  if (!data) return;
  void* base = static_cast<char*>(data) - kHeader;
  const int64_t n = *static_cast<int64_t*>(base);
  g_live.fetch_sub(n, std::memory_order_relaxed);
  c10::free_cpu(base);
}

class TrackingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    void* base = c10::alloc_cpu(n + kHeader);
    *static_cast<int64_t*>(base) = static_cast<int64_t>(n);
    raise_peak(g_live.fetch_add(int64_t(n), std::memory_order_relaxed) + int64_t(n));
    g_count.fetch_add(1, std::memory_order_relaxed);
    void* data = static_cast<char*>(base) + kHeader;
    return {data, data, &tracked_delete, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &tracked_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

TrackingCpuAllocator g_allocator;
MemoryTracker* g_tracker = nullptr;
std::once_flag g_once;

}  // namespace

MemoryTracker& MemoryTracker::install() {
  static MemoryTracker tracker;
  std::call_once(g_once, [] {
    c10::SetCPUAllocator(&g_allocator, /*priority=*/100);
    g_tracker = &tracker;
  });
  return tracker;
}

MemoryTracker* MemoryTracker::get() { return g_tracker; }
int64_t MemoryTracker::live_bytes() const { return g_live.load(); }
int64_t MemoryTracker::peak_bytes() const { return g_peak.load(); }
int64_t MemoryTracker::allocations() const { return g_count.load(); }
void MemoryTracker::reset_peak() { g_peak.store(g_live.load()); }

}  // namespace gmod

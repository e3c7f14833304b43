// MemoryTracker: counts the bytes of every live CPU tensor allocation and the peak since the last reset, by
// installing a c10::Allocator in front of c10's CPU allocator (c10::SetCPUAllocator, high priority). Every
// CPU tensor of LibTorch (parameters, activations saved for backward, gradients, communication buffers) goes
// through it; allocations made outside c10 (MPI buffers, oneDNN scratch, the Python-free runtime itself) are
// not counted, which is what the memory plan (trainer/plan/memory_plan.h) estimates too. Counts are the requested
// tensor bytes (nbytes), not malloc's rounding. Process-wide; install once before the tensors to be measured
// are created (tensors created earlier are freed by their own allocator and never counted).
#pragma once

#include <cstdint>

namespace gmod {

class MemoryTracker {
 public:
  // Installs the tracking allocator (idempotent; never uninstalled: tensors may outlive any scope).
  static MemoryTracker& install();
  // The tracker if install() was called, else nullptr.
  static MemoryTracker* get();

  int64_t live_bytes() const;   // CPU tensor bytes allocated through the tracker and not yet freed
  int64_t peak_bytes() const;   // max of live_bytes() since the last reset_peak()
  int64_t allocations() const;  // allocations since install
  void reset_peak();            // peak := live

 private:
  MemoryTracker() = default;
};

}  // namespace gmod

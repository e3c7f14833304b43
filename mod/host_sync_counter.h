// HostSyncCounter: counts, while an instance is alive, the operator calls at which the host waits for a
// device result, so that benchmarks and tests can pin "no host synchronisation inside MoD layers in
// training". Observed through ATen's RecordFunction (global callbacks, every thread, so backward is
// included):
//  - scalar reads: aten::_local_scalar_dense (Tensor::item, item<T>(), a tensor used as a bool);
//  - data-sized outputs: aten::nonzero (masked_select, boolean indexing and unique go through it or sync
//  alike);
//  - copies to the host: aten::copy_ from a non-CPU tensor into a CPU one;
//  - copies to the host that are free on a CPU-only run but would wait on an accelerator: aten::to with the
//  CPU as
//    target device applied to a CPU tensor (Tensor::cpu(), .to(kCPU));
//  - host-to-device copies that block the host: aten::copy_ from a CPU tensor into a device one that is
//  blocking or
//    from pageable (unpinned) memory (data/batch.h to_model_inputs copies pinned batches non-blocking: none).
// On the CPU none of these block; the count is what the same code would synchronise on a GPU. One counter at
// a time (the callback writes process-wide counters).
#pragma once

#include <cstdint>
#include <string>

namespace gmod {

class HostSyncCounter {
 public:
  struct Counts {
    int64_t scalar_reads = 0, data_sized = 0, device_to_host = 0, to_cpu = 0, host_to_device = 0;
    int64_t total() const { return scalar_reads + data_sized + device_to_host + to_cpu + host_to_device; }
    std::string to_string() const;  // "N (item A, nonzero B, D2H C, .cpu() D, blocking H2D E)"
  };
  HostSyncCounter();  // starts counting from zero; throws std::logic_error if another counter is alive
  ~HostSyncCounter();
  HostSyncCounter(const HostSyncCounter&) = delete;
  HostSyncCounter& operator=(const HostSyncCounter&) = delete;

  Counts counts() const;  // since construction or the last reset()
  void reset();

 private:
  uint64_t handle_ = 0;
};

}  // namespace gmod

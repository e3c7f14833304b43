#include "mod/host_sync_counter.h"

#include <ATen/record_function.h>

#include <atomic>
#include <cstring>
#include <stdexcept>

namespace gmod {

namespace {

std::atomic<int64_t> g_scalar{0}, g_sized{0}, g_d2h{0}, g_to_cpu{0}, g_h2d{0};
std::atomic<bool> g_alive{false};

bool is_cpu_tensor(const c10::IValue& v) { return v.isTensor() && v.toTensor().defined() && v.toTensor().is_cpu(); }

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  const char* name = fn.name();
  if (!std::strcmp(name, "aten::_local_scalar_dense")) {
    ++g_scalar;
  } else if (!std::strcmp(name, "aten::nonzero")) {
    ++g_sized;
  } else if (!std::strcmp(name, "aten::copy_")) {
    auto in = fn.inputs();
    if (in.size() >= 2 && is_cpu_tensor(in[0]) && in[1].isTensor() && in[1].toTensor().defined() &&
        !in[1].toTensor().is_cpu())
      ++g_d2h;
    else if (in.size() >= 2 && in[0].isTensor() && in[0].toTensor().defined() && !in[0].toTensor().is_cpu() &&
             is_cpu_tensor(in[1])) {  // host -> device: blocks unless pinned and non-blocking
      const bool non_blocking = in.size() >= 3 && in[2].isBool() && in[2].toBool();
      if (!non_blocking || !in[1].toTensor().is_pinned()) ++g_h2d;
    }
  } else if (!std::strcmp(name, "aten::to")) {
    auto in = fn.inputs();
    if (in.empty() || !is_cpu_tensor(in[0])) return nullptr;  // a real copy is counted at its copy_
    for (size_t i = 1; i < in.size(); ++i)
      if (in[i].isDevice() && in[i].toDevice().is_cpu()) {
        ++g_to_cpu;
        break;
      }
  }
  return nullptr;
}

}  // namespace

std::string HostSyncCounter::Counts::to_string() const {
  return std::to_string(total()) + " (item " + std::to_string(scalar_reads) + ", nonzero " +
         std::to_string(data_sized) + ", D2H " + std::to_string(device_to_host) + ", .cpu() " +
         std::to_string(to_cpu) + ", blocking H2D " + std::to_string(host_to_device) + ")";
}

HostSyncCounter::HostSyncCounter() {
  if (g_alive.exchange(true)) throw std::logic_error("HostSyncCounter: another counter is alive");
  reset();
  handle_ = at::addGlobalCallback(at::RecordFunctionCallback(&on_start).needsInputs(true));
}

HostSyncCounter::~HostSyncCounter() {
  at::removeCallback(handle_);
  g_alive = false;
}

HostSyncCounter::Counts HostSyncCounter::counts() const {
  Counts c;
  c.scalar_reads = g_scalar;
  c.data_sized = g_sized;
  c.device_to_host = g_d2h;
  c.to_cpu = g_to_cpu;
  c.host_to_device = g_h2d;
  return c;
}

void HostSyncCounter::reset() { g_scalar = g_sized = g_d2h = g_to_cpu = g_h2d = 0; }

}  // namespace gmod

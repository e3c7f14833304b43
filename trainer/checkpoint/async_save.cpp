// AsyncCheckpointSave: see async_save.h.
#include "trainer/checkpoint/async_save.h"

#include <exception>

namespace gmod {

AsyncCheckpointSave::AsyncCheckpointSave(CheckpointWriter writer, CheckpointContent content, RankState mine)
    : writer_(std::move(writer)), content_(std::move(content)), mine_(std::move(mine)) {
  thread_ = std::thread([this] {
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

at::Tensor host_snapshot(const at::Tensor& t) {
  at::Tensor d = t.detach();
  if (!d.is_cuda()) return d.clone(at::MemoryFormat::Contiguous);
  at::Tensor h = at::empty(d.sizes(), d.options().device(at::kCPU).pinned_memory(true));
  h.copy_(d);
  return h;
}

int64_t snapshot_bytes(const NamedTensors& ts) {
  int64_t b = 0;
  for (const auto& [n, t] : ts) b += t.numel() * int64_t(t.element_size());
  return b;
}

}  // namespace gmod

// LocalComm: a world of one process with no MPI behind it; every collective is a copy or a no-op. Lets
// single-process code (unit tests, a CPU debug run, loading a checkpoint for export) use DataParallelOptimizer.
#pragma once

#include "parallel/comm.h"

#include <stdexcept>

namespace gmod {

class LocalComm final : public Comm {
 public:
  explicit LocalComm(at::Device device = at::Device(at::kCPU)) : device_(device) {}

  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int local_rank() const override { return 0; }
  at::Device device() const override { return device_; }
  std::string backend() const override { return "local"; }

  using Comm::all_reduce;
  void all_reduce(at::Tensor& t, ReduceOp) override { check_tensor(t, "all_reduce"); }
  void reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp) override {
    check_tensor(in, "reduce_scatter(in)");
    check_tensor(out, "reduce_scatter(out)");
    if (in.numel() != out.numel()) throw std::runtime_error("parallel/local_comm: reduce_scatter size mismatch");
    if (in.data_ptr() != out.data_ptr()) out.view({-1}).copy_(in.view({-1}));
  }
  void all_gather(const at::Tensor& in, at::Tensor& out) override {
    check_tensor(in, "all_gather(in)");
    check_tensor(out, "all_gather(out)");
    if (in.numel() != out.numel()) throw std::runtime_error("parallel/local_comm: all_gather size mismatch");
    if (in.data_ptr() != out.data_ptr()) out.view({-1}).copy_(in.view({-1}));
  }
  void broadcast(at::Tensor& t, int) override { check_tensor(t, "broadcast"); }
  void barrier() override {}
  std::shared_ptr<Comm> duplicate() const override { return std::make_shared<LocalComm>(device_); }

 private:
  at::Device device_;
};

}  // namespace gmod

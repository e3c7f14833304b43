// bench_parallel: time per optimizer step and bytes communicated per step for ZeRO stage 0/1/2 at the world size it
// is launched with (mpirun -np N; bench/run_parallel.sh runs 1, 2, 4), optimizer memory per rank next to its
// formula, and on CUDA the NCCL all-reduce bus bandwidth for a few sizes.
//   bench_parallel [--params N] [--steps K] [--device cpu|cuda] [--dtype fp32|bf16] [--bucket-mb B]
#include "parallel/data_parallel.h"
#include "parallel/runtime.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#ifdef GMOD_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

using namespace gmod;

namespace {

struct Args {
  int64_t params = 4'000'000;
  int steps = 5;
  std::string device = "cpu", dtype = "fp32";
  double bucket_mb = 25;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("bench_parallel: " + k + " needs a value");
      return argv[++i];
    };
    if (k == "--params") a.params = std::stoll(next());
    else if (k == "--steps") a.steps = std::stoi(next());
    else if (k == "--device") a.device = next();
    else if (k == "--dtype") a.dtype = next();
    else if (k == "--bucket-mb") a.bucket_mb = std::stod(next());
    else throw std::runtime_error("bench_parallel: unknown argument " + k);
  }
  return a;
}

void sync(const at::Device& d) {
#ifdef GMOD_WITH_CUDA
  if (d.is_cuda()) c10::cuda::device_synchronize();
#endif
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void bench_stage(const std::shared_ptr<Comm>& comm, const Args& a, int stage) {
  const at::Device dev = comm->device();
  const auto opts = at::TensorOptions().device(dev).dtype(a.dtype == "bf16" ? at::kBFloat16 : at::kFloat);
  // Four tensors of uneven sizes summing to a.params (an odd remainder keeps shards uneven).
  std::vector<int64_t> sizes = {a.params / 2, a.params / 4, a.params / 8};
  sizes.push_back(a.params - sizes[0] - sizes[1] - sizes[2]);
  DataParallelOptimizer::NamedParams params;
  at::manual_seed(0);
  for (size_t i = 0; i < sizes.size(); ++i)
    params.push_back({"p" + std::to_string(i), at::randn({sizes[i]}, opts).requires_grad_()});
  DataParallelOptions o;
  o.stage = stage;
  o.max_grad_norm = 1.0;
  o.weight_decay = 0.01;
  o.bucket_bytes = static_cast<int64_t>(a.bucket_mb * (1 << 20));
  DataParallelOptimizer opt(params, comm, o);

  double total = 0;
  int64_t payload = 0;
  double wire = 0;
  for (int s = -1; s < a.steps; ++s) {  // step -1 warms up
    opt.zero_grad();
    {
      c10::NoGradGuard ng;
      for (auto& [name, p] : params) p.mutable_grad().normal_(0, 1e-3);
    }
    sync(dev);
    comm->barrier();
    comm->reset_stats();
    const double t0 = now();
    opt.step(1e-4);
    sync(dev);
    const double dt = now() - t0;
    if (s >= 0) {
      total += comm->all_reduce(dt, ReduceOp::Max);  // slowest rank
      payload += comm->stats().payload_bytes;
      wire += comm->stats().wire_bytes;
    }
  }
  const int n = comm->world_size();
  const int64_t P = a.params, S = (P + n - 1) / n;
  const int64_t formula = stage == 0 ? 12 * P : 12 * S;
  const int64_t bytes = opt.optimizer_state_bytes();
  const double max_bytes = comm->all_reduce(double(bytes), ReduceOp::Max);
  if (comm->rank() == 0)
    std::printf("stage %d  world %d  %-4s %-4s  P=%lld  step %8.2f ms  comm/step: payload %8.2f MB  wire/rank %8.2f MB"
                "  optimizer state/rank %8.2f MB (max over ranks %.2f MB; formula %s = %.2f MB) %s\n",
                stage, n, a.device.c_str(), a.dtype.c_str(), static_cast<long long>(P), 1e3 * total / a.steps,
                payload / 1e6 / a.steps, wire / 1e6 / a.steps, bytes / 1e6, max_bytes / 1e6,
                stage == 0 ? "12*P" : "12*ceil(P/N)", formula / 1e6, bytes == formula ? "ok" : "MISMATCH");
}

void bench_allreduce(const std::shared_ptr<Comm>& comm) {
  const at::Device dev = comm->device();
  const int n = comm->world_size();
  if (comm->rank() == 0) std::printf("%s all_reduce (fp32, sum), world %d\n", comm->backend().c_str(), n);
  for (int64_t mb : {1, 8, 64, 256}) {
    const int64_t numel = mb * (1 << 20) / 4;
    at::Tensor t = at::ones({numel}, at::TensorOptions().device(dev).dtype(at::kFloat));
    comm->all_reduce(t, ReduceOp::Sum);  // warm up
    sync(dev);
    const int iters = 10;
    comm->barrier();
    const double t0 = now();
    for (int i = 0; i < iters; ++i) comm->all_reduce(t, ReduceOp::Sum);
    sync(dev);
    const double dt = comm->all_reduce((now() - t0) / iters, ReduceOp::Max);
    const double algbw = numel * 4.0 / dt / 1e9;
    if (comm->rank() == 0)
      std::printf("  %4lld MB  %9.3f ms  algbw %7.2f GB/s  busbw %7.2f GB/s\n", static_cast<long long>(mb), dt * 1e3,
                  algbw, algbw * (n > 1 ? 2.0 * (n - 1) / n : 0.0));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Runtime rt(&argc, &argv);
  return run_guarded([&] {
    Args a = parse(argc, argv);
    auto comm = make_comm(a.device == "cuda" ? at::Device(at::kCUDA) : at::Device(at::kCPU));
    for (int stage : {0, 1, 2}) bench_stage(comm, a, stage);
    if (comm->device().is_cuda()) bench_allreduce(comm);
    return 0;
  });
}

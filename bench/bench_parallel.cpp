// bench_parallel: time per optimizer step and bytes communicated per step for ZeRO stage 0/1/2 at the world size it
// is launched with (mpirun -np N; bench/run_parallel.sh runs 1, 2, 4), optimizer memory per rank next to its
// formula, and on CUDA the NCCL all-reduce bus bandwidth for a few sizes. --mode mlp instead times whole training
// steps (forward + backward of a small MLP stack, then step) with the gradient reduction overlapped with backward
// (--overlap 1), not overlapped (0) or both, next to each other.
//   bench_parallel [--mode step|mlp] [--params N] [--steps K] [--device cpu|cuda] [--dtype fp32|bf16]
//                  [--bucket-mb B] [--overlap 0|1|both] [--layers L] [--width D] [--batch B] [--stage S]
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "bench/bench_help.h"
#include "parallel/data_parallel.h"
#include "parallel/runtime.h"
#ifdef GMOD_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <chrono>
#include <cmath>
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
  std::string mode = "step", overlap = "both";
  int layers = 8, width = 1024, batch = 64, stage = 0;
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
    else if (k == "--mode") a.mode = next();
    else if (k == "--overlap") a.overlap = next();
    else if (k == "--layers") a.layers = std::stoi(next());
    else if (k == "--width") a.width = std::stoi(next());
    else if (k == "--batch") a.batch = std::stoi(next());
    else if (k == "--stage") a.stage = std::stoi(next());
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
      // As a backward would: ZeRO-2 leaves the .grad of released buckets undefined after a step, and autograd
      // then creates a fresh tensor, which the optimizer copies into the re-allocated bucket.
      for (auto& [name, p] : params) {
        if (!p.grad().defined()) p.mutable_grad() = at::empty_like(p);
        p.mutable_grad().normal_(0, 1e-3);
      }
    }
    sync(dev);
    comm->barrier();
    comm->reset_stats();
    opt.grad_comm().reset_stats();
    const double t0 = now();
    opt.step(1e-4);
    sync(dev);
    const double dt = now() - t0;
    if (s >= 0) {
      total += comm->all_reduce(dt, ReduceOp::Max);  // slowest rank
      payload += comm->stats().payload_bytes;
      wire += comm->stats().wire_bytes;
      if (&opt.grad_comm() != comm.get()) {  // bucket reductions run on the optimizer's own communicator
        payload += opt.grad_comm().stats().payload_bytes;
        wire += opt.grad_comm().stats().wire_bytes;
      }
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

// Training steps of an MLP stack (layers x [width, width] + bias, tanh) on a random batch per rank: forward,
// backward (with set_last_micro_batch, so overlap_comm reduces buckets while backward runs), step.
void bench_mlp(const std::shared_ptr<Comm>& comm, const Args& a, bool overlap) {
  const at::Device dev = comm->device();
  const auto opts = at::TensorOptions().device(dev).dtype(a.dtype == "bf16" ? at::kBFloat16 : at::kFloat);
  at::manual_seed(0);
  DataParallelOptimizer::NamedParams params;
  std::vector<at::Tensor> w, b;
  for (int l = 0; l < a.layers; ++l) {
    w.push_back((at::randn({a.width, a.width}, opts) / std::sqrt(double(a.width))).requires_grad_());
    b.push_back(at::zeros({a.width}, opts).requires_grad_());
    params.push_back({"layer" + std::to_string(l) + ".weight", w.back()});
    params.push_back({"layer" + std::to_string(l) + ".bias", b.back()});
  }
  DataParallelOptions o;
  o.stage = a.stage;
  o.max_grad_norm = 1.0;
  o.bucket_bytes = static_cast<int64_t>(a.bucket_mb * (1 << 20));
  o.overlap_comm = overlap;
  DataParallelOptimizer opt(params, comm, o);
  at::manual_seed(1 + comm->rank());
  at::Tensor x = at::randn({a.batch, a.width}, opts);
  double total = 0;
  int early = 0;
  for (int s = -1; s < a.steps; ++s) {
    sync(dev);
    comm->barrier();
    const double t0 = now();
    opt.zero_grad();
    at::Tensor h = x;
    for (int l = 0; l < a.layers; ++l) h = at::tanh(at::linear(h, w[l], b[l]));
    opt.set_last_micro_batch();
    h.pow(2).mean().backward();
    early = opt.buckets_launched_early();
    opt.step(1e-4);
    sync(dev);
    if (s >= 0) total += comm->all_reduce(now() - t0, ReduceOp::Max);
  }
  int64_t P = 0;
  for (auto& [n, p] : params) P += p.numel();
  if (comm->rank() == 0)
    std::printf("mlp  stage %d  world %d  %-4s %-4s  %d x [%d, %d], batch %d, P=%lld, %zu buckets of %.2f MB  "
                "overlap %d: step %8.2f ms (buckets started during backward: %d)\n",
                a.stage, comm->world_size(), a.device.c_str(), a.dtype.c_str(), a.layers, a.width, a.width, a.batch,
                static_cast<long long>(P), opt.buckets().size(), a.bucket_mb, overlap ? 1 : 0,
                1e3 * total / a.steps, early);
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

const char* const kUsage =
    "usage: bench_parallel [--mode step|mlp] [--params N] [--steps K] [--device cpu|cuda] [--dtype\n"
    "                      fp32|bf16]\n"
    "                      [--bucket-mb B] [--overlap 0|1|both] [--layers L] [--width D] [--batch B]\n"
    "                      [--stage S]\n"
    "Time per optimizer step, bytes communicated and optimizer memory per rank for ZeRO stages 0/1/2 at\n"
    "the world size it is launched with (mpirun -np N; bench/run_parallel.sh runs 1, 2, 4); on CUDA the\n"
    "NCCL all-reduce bus bandwidth. --mode mlp times whole training steps of an MLP stack with and\n"
    "without overlapped reduction.\n";

int main(int argc, char** argv) {
  if (gmod::bench_help(argc, argv, kUsage)) return 0;
  Runtime rt(&argc, &argv);
  return run_guarded([&] {
    Args a = parse(argc, argv);
    auto comm = make_comm(a.device == "cuda" ? at::Device(at::kCUDA) : at::Device(at::kCPU));
    if (a.mode == "mlp") {
      if (a.overlap != "1") bench_mlp(comm, a, false);
      if (a.overlap != "0") bench_mlp(comm, a, true);
      return 0;
    }
    if (a.mode != "step") throw std::runtime_error("bench_parallel: --mode must be step or mlp");
    for (int stage : {0, 1, 2}) bench_stage(comm, a, stage);
    if (comm->device().is_cuda()) bench_allreduce(comm);
    return 0;
  });
}

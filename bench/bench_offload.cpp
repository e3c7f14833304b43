// bench_offload: time of the offloaded optimizer step (optimizer.offload: "cpu") per GiB of fp32 master
// weights: the vectorised CPU AdamW of parallel/adamw_cpu.h over the shard (on --threads threads, and on
// one), then the updated shard converted to the parameters' dtype (the part copied back to the device;
// --dtype), next to the device-resident path's ATen sequence run on the CPU (ShardedAdamW without offload:
// seven ATen kernels and a temporary per chunk). Reports ms per step and ms per GiB of master for each shard
// size, and whether both paths gave bitwise the same state. Single process, no MPI.
//   bench_offload [--mib M[,M...]] [--threads T] [--steps K] [--dtype bf16|fp32]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench_help.h"
#include "parallel/adamw_cpu.h"
#include "parallel/sharded_adamw.h"

using namespace gmod;

const char* const kUsage =
    "usage: bench_offload [--mib M[,M...]] [--threads T] [--steps K] [--dtype bf16|fp32]\n"
    "Time of the offloaded AdamW step (optimizer.offload: cpu) per GiB of fp32 master: the vectorised CPU "
    "update\n"
    "on T threads and on one, plus the conversion of the updated shard to the parameters' dtype, next to "
    "the\n"
    "device-resident path's ATen sequence on the CPU; checks both give bitwise the same state.\n"
    "Defaults: --mib 64,256 (fp32 master per shard), --threads = ATen's intra-op threads, --steps 5.\n";

namespace {

double median_ms(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
double time_ms(int steps, F&& f) {
  std::vector<double> t;
  f();  // warm-up (first touch of the pages, the state's allocation)
  for (int i = 0; i < steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return median_ms(t);
}

}  // namespace

int main(int argc, char** argv) {
  if (bench_help(argc, argv, kUsage)) return 0;
  try {
    std::vector<int64_t> mibs = {64, 256};
    int threads = at::get_num_threads(), steps = 5;
    std::string dtype = "bf16";
    for (int i = 1; i < argc; ++i) {
      const std::string k = argv[i];
      if (i + 1 >= argc) throw std::invalid_argument("bench_offload: " + k + " needs a value");
      const std::string v = argv[++i];
      if (k == "--mib") {
        mibs.clear();
        std::stringstream ss(v);
        for (std::string x; std::getline(ss, x, ',');) mibs.push_back(std::stoll(x));
      } else if (k == "--threads") {
        threads = std::stoi(v);
      } else if (k == "--steps") {
        steps = std::stoi(v);
      } else if (k == "--dtype") {
        dtype = v;
      } else {
        throw std::invalid_argument("bench_offload: unknown option " + k);
      }
    }
    if (dtype != "bf16" && dtype != "fp32")
      throw std::invalid_argument("bench_offload: --dtype bf16 or fp32");
    if (threads < 1 || steps < 1)
      throw std::invalid_argument("bench_offload: --threads and --steps must be >= 1");
    const at::ScalarType pdt = dtype == "bf16" ? at::kBFloat16 : at::kFloat;
    std::printf("bench_offload: %d threads, %d timed steps (median), parameters %s, ATen lerp/addcmul %s\n",
                threads, steps, dtype.c_str(), adamw_cpu_aten_fuses() ? "fused (FMA)" : "unfused");
    std::printf("%-10s %-34s %10s %12s\n", "master", "path", "ms/step", "ms/GiB");
    for (int64_t mib : mibs) {
      const int64_t n = std::max<int64_t>(1, (mib << 20) / 4);
      const double gib = double(n) * 4 / double(int64_t(1) << 30);
      at::manual_seed(1);
      at::Tensor master0 = at::randn({n}), grad = at::randn({n}) * 1e-2;
      at::Tensor params = at::empty({n}, at::TensorOptions().dtype(pdt));
      AdamWHyper h, off;
      h.weight_decay = off.weight_decay = 0.01;
      off.offload = true;
      auto row = [&](const char* path, double ms) {
        std::printf("%-10s %-34s %10.2f %12.1f\n", (std::to_string(mib) + " MiB").c_str(), path, ms,
                    ms / gib);
      };
      at::set_num_threads(threads);
      {
        ShardedAdamW a(0, n, master0, h);
        row("ATen sequence (not offloaded)", time_ms(steps, [&] { a.step(grad, 1e-3); }));
      }
      ShardedAdamW o(0, n, master0, off);
      row(("offload update, " + std::to_string(threads) + " threads").c_str(),
          time_ms(steps, [&] { o.step(grad, 1e-3); }));
      row(("offload update + to " + dtype).c_str(), time_ms(steps, [&] {
            o.step(grad, 1e-3);
            o.copy_master_to(params);
          }));
      at::set_num_threads(1);
      ShardedAdamW o1(0, n, master0, off);
      row("offload update, 1 thread", time_ms(steps, [&] { o1.step(grad, 1e-3); }));
      at::set_num_threads(threads);
      // Same number of steps through both paths: the state must agree bit for bit.
      ShardedAdamW a(0, n, master0, h), b(0, n, master0, off);
      for (int s = 0; s < 3; ++s) {
        a.step(grad * (s + 1), 1e-3);
        b.step(grad * (s + 1), 1e-3);
      }
      const bool same = a.master().view(at::kInt).equal(b.master().view(at::kInt)) &&
                        a.exp_avg().view(at::kInt).equal(b.exp_avg().view(at::kInt)) &&
                        a.exp_avg_sq().view(at::kInt).equal(b.exp_avg_sq().view(at::kInt));
      std::printf("%-10s bitwise equal to the ATen sequence after 3 steps: %s\n", "", same ? "yes" : "NO");
      if (!same) return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_offload: %s\n", e.what());
    return 1;
  }
}

// bench_zero: ZeRO stages and optimizer offload side by side on one model, at the world size it is launched
// with (the table: mpirun -np 2). For ZeRO-1, ZeRO-2, ZeRO-3, and ZeRO-1/2 with optimizer offload,
// rank 0 prints the step time (mean of --steps real training steps: forward, label-only loss, backward with
// bucketed reductions, AdamW, zero_grad), the peak CPU tensor bytes per rank (MemoryTracker, max over ranks)
// next to the plan's device + host total, and the bytes communicated per step (every collective of the
// optimizer's communicators, CommStats) next to the plan's theory (ZeRO-3: the forward's gather of every
// unit, the backward's of the hooked units, one gradient reduce-scatter; about 1.5x ZeRO-2 when the
// persistent units are small). ZeRO-3 runs at prefetch 0, 1 and 2 (its gathers non-blocking, overlapping the
// running unit) and without reshard after forward. A configuration the trainer config refuses (e.g. ZeRO-3
// with bf16 accumulate_fp32) prints "refused by the config" in its row instead of failing. The model is the
// memory-plan test's small LLaVA (tests/trainer/memory_plan_util.h) unless the options change it;
// --checkpointing full checkpoints every decoder layer (ZeRO-3 then gathers each unit again for its
// recompute), --only-zero3 runs the ZeRO-3 rows alone.
// --overlap MIB instead measures what a non-blocking unit gather (Comm::all_gather_v_start, MPI_Iallgatherv,
// as ZeRO-3's prefetch issues it) overlaps with compute: the gather of MIB MiB alone, matrix products of
// about the same time alone, then both, with no MPI call during the compute (as a recompute) and with a
// test() of the request after every product (as the unit hooks' polls); medians of 7 (docs/parallel.md,
// "Prefetch timing").
//   bench_zero [--dtype fp32|bf16] [--batch B] [--seq L] [--layers N] [--hidden D] [--vocab V] [--steps K]
//              [--checkpointing none|full] [--only-zero3] [--overlap MIB]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench_help.h"
#include "bench/plan_bench_shape.h"
#include "parallel/mpi_comm.h"
#include "parallel/runtime.h"
#include "tests/trainer/memory_plan_util.h"
#include "trainer/config/train_config.h"
#include "trainer/plan/memory_probe.h"

using namespace gmod;

const char* const kUsage =
    "usage: bench_zero [--dtype fp32|bf16] [--batch B] [--seq L] [--layers N] [--hidden D] [--vocab V]\n"
    "                  [--steps K] [--checkpointing none|full] [--only-zero3] [--overlap MIB]\n"
    "ZeRO-1, ZeRO-2, ZeRO-3 and optimizer offload on one small LLaVA at the launched world size (mpirun -np "
    "2):\n"
    "step time, peak memory per rank (measured, plan) and bytes communicated per step (measured, theory).\n"
    "A configuration the trainer config refuses prints \"refused by the config\".\n"
    "--overlap MIB: how much of a non-blocking MIB-MiB gather overlaps compute (without and with MPI_Test "
    "calls).\n";

namespace {

// The trainer config's verdict on a stage/offload pair ("" = accepted).
std::string refusal(int stage, const std::string& offload, int world) {
  TrainConfig c;
  c.optimizer.zero_stage = stage;
  c.optimizer.offload = offload;
  for (const auto& e : check_train_config(c, world))
    if (e.rfind("optimizer.zero_stage", 0) == 0 || e.rfind("optimizer.offload", 0) == 0) return e;
  return "";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// --overlap: a gather of `mib` MiB (fp32, split evenly over the ranks) against `n` 384x384 matrix products.
void overlap_probe(Comm& comm, double mib) {
  const int world = comm.world_size();
  const int64_t numel = std::max<int64_t>(world, int64_t(mib * double(1 << 20) / 4) / world * world);
  std::vector<int64_t> counts(size_t(world), numel / world);
  at::Tensor buf = at::ones({numel}, at::kFloat);
  at::Tensor a = at::randn({384, 384}, at::kFloat), b = at::randn({384, 384}, at::kFloat), c;
  auto compute = [&](int n, CommRequest* poll) {
    for (int i = 0; i < n; ++i) {
      c = at::mm(a, b);
      if (poll) poll->test();
    }
  };
  auto timed = [&](const std::function<void()>& f) {
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return comm.all_reduce(seconds_since(t0), ReduceOp::Max);  // the slower rank's
  };
  constexpr int kReps = 7;
  std::vector<double> g, one;
  for (int r = 0; r < kReps; ++r) {
    g.push_back(timed([&] { comm.all_gather_v_start(buf, counts)->wait(); }));
    one.push_back(timed([&] { compute(1, nullptr); }));
  }
  const double tg = median(g);
  const int n =
      std::max(1, int(std::lround(tg / std::max(1e-6, median(one)))));  // compute ~ the gather's time
  std::vector<double> tc, tnone, twait, ttest;
  for (int r = 0; r < kReps; ++r) {
    tc.push_back(timed([&] { compute(n, nullptr); }));
    double wait_s = 0;
    tnone.push_back(timed([&] {
      auto req = comm.all_gather_v_start(buf, counts);
      compute(n, nullptr);
      const auto t0 = std::chrono::steady_clock::now();
      req->wait();
      wait_s = seconds_since(t0);
    }));
    twait.push_back(comm.all_reduce(wait_s, ReduceOp::Max));
    ttest.push_back(timed([&] {
      auto req = comm.all_gather_v_start(buf, counts);
      compute(n, req.get());
      req->wait();
    }));
  }
  if (comm.rank() != 0) return;
  const double c1 = median(tc), t1 = median(tnone), t2 = median(ttest);
  auto hidden = [&](double t) { return 100.0 * (tg + c1 - t) / std::min(tg, c1); };
  std::printf(
      "overlap probe: world %d, gather %.1f MiB (MPI_Iallgatherv), compute %d x mm 384^3; medians of %d, ms\n"
      "  gather alone %8.2f\n  compute alone %7.2f\n"
      "  both, no MPI call during the compute %8.2f (the wait after it %.2f), hidden %+.0f%% of the shorter\n"
      "  both, test() after every product     %8.2f, hidden %+.0f%% of the shorter\n",
      world, double(numel) * 4 / double(1 << 20), n, kReps, 1e3 * tg, 1e3 * c1, 1e3 * t1, 1e3 * median(twait),
      hidden(t1), 1e3 * t2, hidden(t2));
}

}  // namespace

int main(int argc, char** argv) {
  if (bench_help(argc, argv, kUsage)) return 0;
  Runtime rt(&argc, &argv);
  return run_guarded([&] {
    // bench_zero's own options; the rest are the shared shape options.
    std::string checkpointing = "none";
    bool only_zero3 = false;
    double overlap_mib = 0;
    std::vector<char*> rest = {argv[0]};
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--only-zero3")
        only_zero3 = true;
      else if (a == "--checkpointing" && i + 1 < argc)
        checkpointing = argv[++i];
      else if (a == "--overlap" && i + 1 < argc)
        overlap_mib = std::stod(argv[++i]);
      else
        rest.push_back(argv[i]);
    }
    if (checkpointing != "none" && checkpointing != "full")
      throw std::invalid_argument("bench_zero: --checkpointing must be none or full, got \"" + checkpointing +
                                  "\"");
    const PlanBenchShape shape = parse_plan_bench_shape(int(rest.size()), rest.data(), "bench_zero", 3);
    if (overlap_mib > 0) {
      MpiComm comm;
      overlap_probe(comm, overlap_mib);
      return 0;
    }
    const std::string& dtype = shape.dtype;
    const int batch = shape.batch, seq = shape.seq, layers = shape.layers, hidden = shape.hidden, vocab = shape.vocab,
              steps = shape.steps;
    auto comm = std::make_shared<MpiComm>();
    const int world = comm->world_size();
    const bool root = comm->rank() == 0;
    if (root)
      std::printf(
          "bench_zero: world %d, %s, micro-batch %d x %d tokens, LLM %d layers x %d, vocab %d, %d steps, "
          "checkpointing %s\n"
          "%-18s %10s %12s %12s %8s %12s %12s %12s %7s\n",
          world, dtype.c_str(), batch, seq, layers, hidden, vocab, steps, checkpointing.c_str(), "setting",
          "ms/step", "peak", "plan", "error", "plan device", "comm/step", "theory", "ratio");
    struct Row {
      int stage;
      const char* offload;
      int prefetch = 1;
      bool reshard = true;
    };
    // ZeRO-3 at prefetch 0, 1 (the default) and 2, and without reshard after forward.
    for (const Row r : {Row{1, "none"}, Row{2, "none"}, Row{3, "none", 0}, Row{3, "none", 1}, Row{3, "none", 2},
                        Row{3, "none", 1, false}, Row{1, "cpu"}, Row{2, "cpu"}}) {
      if (only_zero3 && r.stage != 3) continue;
      std::string name = "ZeRO-" + std::to_string(r.stage) + (std::string(r.offload) == "cpu" ? " + offload" : "");
      if (r.stage == 3) name += r.reshard ? " pf" + std::to_string(r.prefetch) : " no reshard";
      MemoryPlanInputs in = shape.inputs(world, r.stage);
      in.offload = r.offload;
      in.zero3_prefetch = r.prefetch;
      in.zero3_reshard_after_forward = r.reshard;
      in.checkpointing = checkpointing;
      const MemoryPlan plan = plan_memory(in);
      auto refused = [&](const std::string& why) {
        if (root)
          std::printf("%-18s refused by the config; plan %s (device %s), theory %s/step; %s\n", name.c_str(),
                      format_bytes(double(plan.total + plan.host_total)).c_str(),
                      format_bytes(double(plan.total)).c_str(), format_bytes(plan.comm_wire_bytes).c_str(),
                      why.c_str());
      };
      if (const std::string why = refusal(r.stage, r.offload, world); !why.empty()) {
        refused(why);
        continue;
      }
      const MemoryMeasurement m = measure_training_memory(in, comm, steps);
      const double peak = comm->all_reduce(double(m.peak_bytes), ReduceOp::Max);
      const double ms = 1e3 * comm->all_reduce(m.step_seconds, ReduceOp::Max);
      const double wire = comm->all_reduce(m.comm_wire_bytes, ReduceOp::Max);
      if (!root) continue;
      const double planned = double(plan.total + plan.host_total);
      std::printf("%-18s %10.1f %12s %12s %+7.2f%% %12s %12s %12s %7.3f\n", name.c_str(), ms,
                  format_bytes(peak).c_str(), format_bytes(planned).c_str(), 100.0 * (planned - peak) / peak,
                  format_bytes(double(plan.total)).c_str(), format_bytes(wire).c_str(),
                  format_bytes(plan.comm_wire_bytes).c_str(),
                  plan.comm_wire_bytes > 0 ? wire / plan.comm_wire_bytes : 0.0);
    }
    if (root)
      std::printf(
          "(comm: ring estimate of the bytes one rank sends per step, measured by the communicators' "
          "counters incl. the loss/norm statistics; theory: `gmod plan`'s; peak includes host memory)\n");
    return 0;
  });
}

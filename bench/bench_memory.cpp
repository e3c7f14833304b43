// bench_memory: peak CPU memory per rank of real training steps, measured with MemoryTracker, next to what
// `gmod plan` estimates (trainer/plan/memory_plan.h), for ZeRO-0/1/2 at the world size it is launched with
// (bench/run_memory.sh runs 1, 2 and 3 ranks). The model is the plan test's small LLaVA (tests/trainer/
// memory_plan_util.h) unless --layers/--hidden/--vocab/--batch/--seq change it. Rank 0 prints one row per
// stage: measured and planned peak, the error, the phase the plan puts the peak in, and the planned terms;
// the maximum over ranks is reported.
//   bench_memory [--dtype fp32|bf16] [--batch B] [--seq L] [--layers N] [--hidden D] [--vocab V] [--steps K]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "bench/bench_help.h"
#include "bench/plan_bench_shape.h"
#include "parallel/mpi_comm.h"
#include "parallel/runtime.h"
#include "tests/trainer/memory_plan_util.h"
#include "trainer/plan/memory_probe.h"

using namespace gmod;

const char* const kUsage =
    "usage: bench_memory [--dtype fp32|bf16] [--batch B] [--seq L] [--layers N] [--hidden D] [--vocab V]\n"
    "                    [--steps K]\n"
    "Peak CPU memory per rank of real training steps next to what `gmod plan` estimates, ZeRO-0/1/2 at\n"
    "the world size it is launched with (bench/run_memory.sh runs 1, 2 and 3 ranks).\n";

int main(int argc, char** argv) {
  if (gmod::bench_help(argc, argv, kUsage)) return 0;
  Runtime rt(&argc, &argv);
  return run_guarded([&] {
    const PlanBenchShape shape = parse_plan_bench_shape(argc, argv, "bench_memory", 2);
    const std::string& dtype = shape.dtype;
    const int batch = shape.batch, seq = shape.seq, layers = shape.layers, hidden = shape.hidden, vocab = shape.vocab,
              steps = shape.steps;
    auto comm = std::make_shared<MpiComm>();
    const int world = comm->world_size();
    if (comm->rank() == 0)
      std::printf(
          "bench_memory: world %d, %s, micro-batch %d x %d tokens, LLM %d layers x %d, vocab %d\n"
          "%-6s %-7s %12s %12s %8s  %-18s %s\n",
          world, dtype.c_str(), batch, seq, layers, hidden, vocab, "world", "stage", "measured", "plan",
          "error", "plan peak phase", "planned terms");
    for (int stage = 0; stage <= 2; ++stage) {
      MemoryPlanInputs in = shape.inputs(world, stage);
      const MemoryPlan plan = plan_memory(in);
      const MemoryMeasurement m = measure_training_memory(in, comm, steps);
      const double peak = comm->all_reduce(double(m.peak_bytes), ReduceOp::Max);
      if (comm->rank() != 0) continue;
      std::string terms;
      for (const auto& t : plan.terms)
        if (t.bytes) terms += t.name + "=" + format_bytes(double(t.bytes)) + " ";
      std::printf("%-6d ZeRO-%-2d %12s %12s %+7.2f%%  %-18s %s\n", world, stage, format_bytes(peak).c_str(),
                  format_bytes(double(plan.total)).c_str(), 100.0 * (double(plan.total) - peak) / peak,
                  plan.peak_phase.c_str(), terms.c_str());
    }
    return 0;
  });
}

// bench_zero: ZeRO stages and optimizer offload side by side on one model, at the world size it is launched
// with (the table: mpirun -np 2). For ZeRO-1, ZeRO-2, ZeRO-3, and ZeRO-1/2 with optimizer offload,
// rank 0 prints the step time (mean of --steps real training steps: forward, label-only loss, backward with
// bucketed reductions, AdamW, zero_grad), the peak CPU tensor bytes per rank (MemoryTracker, max over ranks)
// next to the plan's device + host total, and the bytes communicated per step (every collective of the
// optimizer's communicators, CommStats) next to the plan's theory (ZeRO-3: the forward's gather of every unit,
// the backward's of the hooked units, one gradient reduce-scatter; about 1.5x ZeRO-2 when the persistent units
// are small). ZeRO-3 runs at prefetch 0, 1 and 2 (its gathers non-blocking, overlapping the running unit) and
// without reshard after forward. A configuration the trainer config refuses (e.g. ZeRO-3
// with bf16 accumulate_fp32) prints "refused by the config" in its row instead of failing. The model is the
// memory-plan test's small LLaVA (tests/trainer/memory_plan_util.h) unless the options change it.
//   bench_zero [--dtype fp32|bf16] [--batch B] [--seq L] [--layers N] [--hidden D] [--vocab V] [--steps K]
#include <cstdio>
#include <string>

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
    "                  [--steps K]\n"
    "ZeRO-1, ZeRO-2, ZeRO-3 and optimizer offload on one small LLaVA at the launched world size (mpirun -np "
    "2):\n"
    "step time, peak memory per rank (measured, plan) and bytes communicated per step (measured, theory).\n"
    "A configuration the trainer config refuses prints \"refused by the config\".\n";

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

}  // namespace

int main(int argc, char** argv) {
  if (bench_help(argc, argv, kUsage)) return 0;
  Runtime rt(&argc, &argv);
  return run_guarded([&] {
    const PlanBenchShape shape = parse_plan_bench_shape(argc, argv, "bench_zero", 3);
    const std::string& dtype = shape.dtype;
    const int batch = shape.batch, seq = shape.seq, layers = shape.layers, hidden = shape.hidden, vocab = shape.vocab,
              steps = shape.steps;
    auto comm = std::make_shared<MpiComm>();
    const int world = comm->world_size();
    const bool root = comm->rank() == 0;
    if (root)
      std::printf(
          "bench_zero: world %d, %s, micro-batch %d x %d tokens, LLM %d layers x %d, vocab %d, %d steps\n"
          "%-18s %10s %12s %12s %8s %12s %12s %12s %7s\n",
          world, dtype.c_str(), batch, seq, layers, hidden, vocab, steps, "setting", "ms/step", "peak",
          "plan", "error", "plan device", "comm/step", "theory", "ratio");
    struct Row {
      int stage;
      const char* offload;
      int prefetch = 1;
      bool reshard = true;
    };
    // ZeRO-3 at prefetch 0, 1 (the default) and 2, and without reshard after forward.
    for (const Row r : {Row{1, "none"}, Row{2, "none"}, Row{3, "none", 0}, Row{3, "none", 1}, Row{3, "none", 2},
                        Row{3, "none", 1, false}, Row{1, "cpu"}, Row{2, "cpu"}}) {
      std::string name = "ZeRO-" + std::to_string(r.stage) + (std::string(r.offload) == "cpu" ? " + offload" : "");
      if (r.stage == 3) name += r.reshard ? " pf" + std::to_string(r.prefetch) : " no reshard";
      MemoryPlanInputs in = shape.inputs(world, r.stage);
      in.offload = r.offload;
      in.zero3_prefetch = r.prefetch;
      in.zero3_reshard_after_forward = r.reshard;
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

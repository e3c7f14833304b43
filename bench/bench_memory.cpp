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
    std::string dtype = "fp32";
    int batch = 4, seq = 128, layers = 4, hidden = 128, vocab = 1024, steps = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string k = argv[i], v = argv[i + 1];
      if (k == "--dtype")
        dtype = v;
      else if (k == "--batch")
        batch = std::stoi(v);
      else if (k == "--seq")
        seq = std::stoi(v);
      else if (k == "--layers")
        layers = std::stoi(v);
      else if (k == "--hidden")
        hidden = std::stoi(v);
      else if (k == "--vocab")
        vocab = std::stoi(v);
      else if (k == "--steps")
        steps = std::stoi(v);
      else
        throw std::invalid_argument("bench_memory: unknown option " + k);
    }
    auto comm = std::make_shared<MpiComm>();
    const int world = comm->world_size();
    if (comm->rank() == 0)
      std::printf(
          "bench_memory: world %d, %s, micro-batch %d x %d tokens, LLM %d layers x %d, vocab %d\n"
          "%-6s %-7s %12s %12s %8s  %-18s %s\n",
          world, dtype.c_str(), batch, seq, layers, hidden, vocab, "world", "stage", "measured", "plan",
          "error", "plan peak phase", "planned terms");
    for (int stage = 0; stage <= 2; ++stage) {
      MemoryPlanInputs in = testing::small_plan_inputs(world, stage, dtype);
      in.micro_batch = batch;
      in.seq_len = seq;
      in.model.text.num_hidden_layers = layers;
      in.model.text.hidden_size = hidden;
      in.model.text.intermediate_size = hidden * 43 / 16;
      in.model.text.vocab_size = vocab;
      in.model.image_token_id = vocab - 24;
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

// The model and batch shape of the benchmarks that put real training steps next to `gmod plan` (bench_memory,
// bench_zero): their shared options (--dtype --batch --seq --layers --hidden --vocab --steps) and the plan inputs
// of the plan tests' small LLaVA at that shape. Header-only: each bench is one .cpp.
#pragma once

#include <stdexcept>
#include <string>

#include "tests/trainer/memory_plan_util.h"
#include "trainer/plan/memory_plan.h"

namespace gmod {

struct PlanBenchShape {
  std::string dtype = "fp32";
  int batch = 4, seq = 128, layers = 4, hidden = 128, vocab = 1024, steps = 2;

  // The plan tests' small LLaVA (tests/trainer/memory_plan_util.h) with this LLM and batch shape.
  MemoryPlanInputs inputs(int world, int stage) const {
    MemoryPlanInputs in = testing::small_plan_inputs(world, stage, dtype);
    in.micro_batch = batch;
    in.seq_len = seq;
    in.model.text.num_hidden_layers = layers;
    in.model.text.hidden_size = hidden;
    in.model.text.intermediate_size = hidden * 43 / 16;
    in.model.text.vocab_size = vocab;
    in.model.image_token_id = vocab - 24;
    return in;
  }
};

// Reads the options (pairs "--name value"); an unknown one is an error naming `program`.
inline PlanBenchShape parse_plan_bench_shape(int argc, char** argv, const std::string& program, int default_steps) {
  PlanBenchShape s;
  s.steps = default_steps;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dtype")
      s.dtype = v;
    else if (k == "--batch")
      s.batch = std::stoi(v);
    else if (k == "--seq")
      s.seq = std::stoi(v);
    else if (k == "--layers")
      s.layers = std::stoi(v);
    else if (k == "--hidden")
      s.hidden = std::stoi(v);
    else if (k == "--vocab")
      s.vocab = std::stoi(v);
    else if (k == "--steps")
      s.steps = std::stoi(v);
    else
      throw std::invalid_argument(program + ": unknown option " + k);
  }
  return s;
}

}  // namespace gmod

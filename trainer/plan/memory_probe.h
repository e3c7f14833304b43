// MemoryProbe: measures what the memory plan (trainer/plan/memory_plan.h) estimates. It builds the planned model
// with random weights on the CPU, freezes it like the trainer, wraps the trainable parameters in the real
// DataParallelOptimizer over `comm`, and runs real training steps (forward, token-normalised loss, backward
// with bucketed reductions, AdamW step, zero_grad: the sequence of Trainer::train_step) on synthetic
// full-length batches, with MemoryTracker counting every CPU tensor byte. Used by the plan's validation test
// and bench/bench_memory.cpp. Collective: every rank of comm calls it with the same inputs.
#pragma once

#include <cstdint>
#include <memory>

#include "parallel/comm.h"
#include "trainer/plan/memory_plan.h"

namespace gmod {

struct MemoryMeasurement {
  int64_t peak_bytes = 0;  // peak live bytes during the steps, above what was live before the model existed
  int64_t after_forward_bytes = 0;  // live bytes right after the last forward (loss computed), same baseline
  int64_t steady_bytes = 0;         // live bytes between steps (weights, gradients, optimizer state, inputs)
  // Optimizer offload: the bytes the optimizer holds as host memory (DpMemory::host_state). On the CPU they are
  // counted in the figures above too (host and device are one memory there).
  int64_t host_state_bytes = 0;
  double step_seconds = 0;       // mean wall time of one training step (forward, backward, step, zero_grad)
  int64_t comm_payload_bytes = 0;  // per step, every collective of the optimizer's communicators (CommStats)
  double comm_wire_bytes = 0;      // per step, ring estimate of what this rank sent
};

// in.model, dtype, micro_batch, seq_len, images_per_sample, freeze flags, checkpointing (decoder layers and
// the tower's units), mod layers/router/kept fraction, stage, bucket_bytes, accumulate_fp32, reduce_dtype,
// grad_accum, offload and (stage 3, driven by parallel/zero3_driver.h as the trainer does) zero3_prefetch are
// honoured; comm->world_size() must equal in.world. Installs MemoryTracker if needed.
MemoryMeasurement measure_training_memory(const MemoryPlanInputs& in, std::shared_ptr<Comm> comm,
                                          int steps = 2, uint64_t seed = 0);

}  // namespace gmod

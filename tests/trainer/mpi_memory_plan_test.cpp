// The memory plan against measured peaks: at the launched world size (ctest runs 1, 2 and 3 ranks) and ZeRO
// 0/1/2, real training steps of a small LLaVA-style model (random init, frozen vision tower, real
// DataParallelOptimizer over MPI) are measured with MemoryTracker, and the plan's per-rank total must be
// within 10% of the measured peak on every rank; so must its end-of-forward total (weights + states + saved
// activations + logits) against the live bytes right after the forward. Each term is printed next to the
// measurement.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "parallel/mpi_comm.h"
#include "tests/trainer/memory_plan_util.h"
#include "trainer/plan/memory_probe.h"
#include "trainer/plan/memory_tracker.h"

using namespace gmod;

namespace {

std::shared_ptr<MpiComm> world() {
  static auto c = std::make_shared<MpiComm>();
  return c;
}

double rel_err(double plan, double measured) { return std::fabs(plan - measured) / measured; }

void check(MemoryPlanInputs in, const char* label) {
  in.world = world()->world_size();
  const MemoryPlan plan = plan_memory(in);
  const MemoryMeasurement m = measure_training_memory(in, world());
  // Right after the forward: everything of the forward phase but the shifted-logits copy, freed by then.
  int64_t fwd_plan = 0;
  for (const auto& ph : plan.phases)
    if (ph.name == "forward (loss)") {
      fwd_plan = ph.bytes;
      for (const auto& t : ph.terms)
        if (t.name == "loss_transient") fwd_plan -= t.bytes;
    }
  if (world()->rank() == 0) {
    std::printf(
        "[%s] world %d ZeRO-%d %s: measured peak %s, plan %s (%s, %+.1f%%); after forward measured %s, "
        "plan %s (%+.1f%%)\n",
        label, in.world, in.stage, in.dtype.c_str(), format_bytes(double(m.peak_bytes)).c_str(),
        format_bytes(double(plan.total)).c_str(), plan.peak_phase.c_str(),
        100.0 * (double(plan.total) - double(m.peak_bytes)) / double(m.peak_bytes),
        format_bytes(double(m.after_forward_bytes)).c_str(), format_bytes(double(fwd_plan)).c_str(),
        100.0 * (double(fwd_plan) - double(m.after_forward_bytes)) / double(m.after_forward_bytes));
    for (const auto& t : plan.terms)
      if (t.bytes) std::printf("    %-26s %12lld\n", t.name.c_str(), (long long)t.bytes);
    for (const auto& ph : plan.phases)
      std::printf("    phase %-20s %12lld\n", ph.name.c_str(), (long long)ph.bytes);
  }
  EXPECT_LE(rel_err(double(plan.total), double(m.peak_bytes)), 0.10)
      << label << ": plan " << plan.total << " B vs measured peak " << m.peak_bytes << " B on rank "
      << world()->rank();
  EXPECT_LE(rel_err(double(fwd_plan), double(m.after_forward_bytes)), 0.10)
      << label << ": plan after forward " << fwd_plan << " B vs measured " << m.after_forward_bytes
      << " B on rank " << world()->rank();
}

}  // namespace

TEST(MemoryPlanMeasured, DenseFp32Zero0) { check(gmod::testing::small_plan_inputs(1, 0), "dense"); }
TEST(MemoryPlanMeasured, DenseFp32Zero1) { check(gmod::testing::small_plan_inputs(1, 1), "dense"); }
TEST(MemoryPlanMeasured, DenseFp32Zero2) { check(gmod::testing::small_plan_inputs(1, 2), "dense"); }

TEST(MemoryPlanMeasured, DenseBf16Zero0) { check(gmod::testing::small_plan_inputs(1, 0, "bf16"), "bf16"); }
TEST(MemoryPlanMeasured, DenseBf16Zero2) { check(gmod::testing::small_plan_inputs(1, 2, "bf16"), "bf16"); }

TEST(MemoryPlanMeasured, Bf16AccumulateFp32Zero1) {
  MemoryPlanInputs in = gmod::testing::small_plan_inputs(1, 1, "bf16");
  in.accumulate_fp32 = true;
  in.grad_accum = 2;
  check(in, "bf16 acc32");
}

TEST(MemoryPlanMeasured, GammaModZero1) {
  MemoryPlanInputs in = gmod::testing::small_plan_inputs(1, 1);
  in.mod_layers = {1, 2};
  in.mod_kept_fraction = 1.0 - 0.5 * 16.0 / 128.0;  // half of the 16 image tokens skipped
  check(in, "γ-MoD");
}

TEST(MemoryPlanMeasured, ProjectorOnlyZero2) {  // LLaVA pre-training stage: LLM and vision frozen
  MemoryPlanInputs in = gmod::testing::small_plan_inputs(1, 2);
  in.train_llm = false;
  check(in, "projector only");
}

TEST(MemoryPlanMeasured, FrozenFirstLayersZero1) {
  MemoryPlanInputs in = gmod::testing::small_plan_inputs(1, 1);
  in.frozen_llm_layers = {0, 1};
  check(in, "layers 0-1 frozen");
}

// Short batches: the peak moves to the optimizer step (fp32, AdamW temporaries) and to the end of the
// backward (bf16 ZeRO-2: fp32 bucket copies and reduce-scatter buffers in flight).
TEST(MemoryPlanMeasured, StatesHeavyFp32Zero0) {
  MemoryPlanInputs in = gmod::testing::small_plan_inputs(1, 0);
  in.micro_batch = 1;
  in.seq_len = 32;
  check(in, "short batch");
}

TEST(MemoryPlanMeasured, StatesHeavyBf16Zero2) {
  MemoryPlanInputs in = gmod::testing::small_plan_inputs(1, 2, "bf16");
  in.micro_batch = 1;
  in.seq_len = 32;
  check(in, "short batch");
}

// Small vocabulary, wide MLP: the peak moves into a decoder layer's backward.
TEST(MemoryPlanMeasured, MlpHeavyFp32Zero1) {
  MemoryPlanInputs in = gmod::testing::small_plan_inputs(1, 1);
  in.model.text.vocab_size = 256;
  in.model.image_token_id = 250;
  in.model.text.intermediate_size = 1024;
  check(in, "wide MLP");
}

TEST(MemoryPlanMeasured, TrackerCountsTensorBytes) {
  MemoryTracker& t = MemoryTracker::install();
  const int64_t before = t.live_bytes();
  {
    at::Tensor x = at::empty({1000}, at::TensorOptions().dtype(at::kFloat));
    EXPECT_EQ(t.live_bytes() - before, 4000);
    t.reset_peak();
  }
  EXPECT_EQ(t.live_bytes(), before);
  EXPECT_EQ(t.peak_bytes() - before, 4000);
}

// The memory plan against measured peaks: at the launched world size (ctest runs 1, 2 and 3 ranks) and ZeRO
// 0/1/2/3, real training steps of a small LLaVA-style model (random init, frozen vision tower, real
// DataParallelOptimizer or Zero3Driver over MPI) are measured with MemoryTracker, and the plan's per-rank
// total must be within 10% (ZeRO-3: 3%) of the largest rank's measured peak and no less than any rank's
// (within the same tolerance); its end-of-forward total (weights + states + saved activations + logits) must
// be as close to the live bytes right after the forward on every rank. Each term is printed next to the
// measurement. Optimizer offload on the CPU: host and device are one memory, so the counting allocator sees
// the offloaded state as before. The plan must move it out of the device total into host_terms; the check is
// (1) the device total plus the host total within 10% of the measured peak (and after-forward bytes), and (2)
// the host total equal to the bytes the optimizer itself holds as host memory (DpMemory::host_state), and the
// device-side optimizer_states term zero: a plan that classified them wrongly fails (1) or (2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "parallel/mpi_comm.h"
#include "tests/trainer/memory_plan_util.h"
#include "trainer/config/train_config.h"
#include "trainer/plan/memory_probe.h"
#include "trainer/plan/memory_tracker.h"

using namespace gmod;

namespace {

std::shared_ptr<MpiComm> world() {
  static auto c = std::make_shared<MpiComm>();
  return c;
}

double rel_err(double plan, double measured) { return std::fabs(plan - measured) / measured; }

// How far the plan may fall short of a measurement: `gmod plan` answers "fits" with it, so it must not promise
// much less than a run takes. Over by up to `tolerance` (terms counted at their largest), under by at most 5%
// (transients it leaves out: -3.1% is the largest seen, bf16 ZeRO-2 at 3 ranks, the same on AVX-512 and AVX2).
constexpr double kUnder = 0.05;

void check(MemoryPlanInputs in, const char* label, double tolerance = 0.10) {
  in.world = world()->world_size();
  const MemoryPlan plan = plan_memory(in);
  const MemoryMeasurement m = measure_training_memory(in, world());
  if (in.offload == "cpu") {
    EXPECT_EQ(plan.host_total, m.host_state_bytes)
        << label << ": host bytes planned vs held by the optimizer";
    EXPECT_GT(plan.host_total, 0) << label;
    EXPECT_EQ(plan.term_bytes("optimizer_states"), 0) << label << ": offloaded state counted on the device";
  } else {
    EXPECT_EQ(plan.host_total, 0) << label;
  }
  // Right after the forward: everything of the forward phase but the shifted-logits copy, freed by then.
  int64_t fwd_plan = 0;
  for (const auto& ph : plan.phases)
    if (ph.name == "forward (loss)") {
      fwd_plan = ph.bytes;
      for (const auto& t : ph.terms)
        if (t.name == "loss_transient") fwd_plan -= t.bytes;
    }
  fwd_plan += plan.host_total;  // the CPU's one memory: device and host bytes together
  // Every rank's measured peak. The plan is the peak of the rank that holds the most (ZeRO-3: a unit's
  // reduction in flight holds `out` and a receive buffer for the rank's block of the unit, so the rank that
  // owns the unit reduced while the backward peaks holds more than the others): within `tolerance` of the
  // largest peak, and at least every rank's peak (within the same tolerance).
  at::Tensor peaks = at::zeros({in.world}, at::kDouble);
  peaks[world()->rank()] = double(m.peak_bytes);
  world()->all_reduce(peaks, ReduceOp::Sum);
  const double max_peak = peaks.max().item<double>();
  if (world()->rank() == 0) {
    std::string per_rank;
    for (int r = 0; r < in.world; ++r) per_rank += (r ? " / " : "") + format_bytes(peaks[r].item<double>());
    std::printf("    measured peak per rank: %s\n", per_rank.c_str());
    std::printf(
        "[%s] world %d ZeRO-%d %s%s%s: measured peak %s (largest rank), plan %s (%s, %+.1f%%); after forward "
        "measured %s, "
        "plan %s (%+.1f%%)\n",
        label, in.world, in.stage, in.dtype.c_str(), in.offload == "cpu" ? " offload" : "",
        in.checkpointing == "none" ? "" : (" checkpointing " + in.checkpointing).c_str(),
        format_bytes(max_peak).c_str(), format_bytes(double(plan.total + plan.host_total)).c_str(),
        plan.peak_phase.c_str(), 100.0 * (double(plan.total + plan.host_total) - max_peak) / max_peak,
        format_bytes(double(m.after_forward_bytes)).c_str(), format_bytes(double(fwd_plan)).c_str(),
        100.0 * (double(fwd_plan) - double(m.after_forward_bytes)) / double(m.after_forward_bytes));
    for (const auto& t : plan.terms)
      if (t.bytes) std::printf("    %-26s %12lld\n", t.name.c_str(), (long long)t.bytes);
    for (const auto& t : plan.host_terms)
      if (t.bytes) std::printf("    host %-21s %12lld\n", t.name.c_str(), (long long)t.bytes);
    for (const auto& ph : plan.phases)
      std::printf("    phase %-20s %12lld\n", ph.name.c_str(), (long long)ph.bytes);
  }
  const int64_t total = plan.total + plan.host_total;
  EXPECT_LE(rel_err(double(total), max_peak), tolerance)
      << label << ": plan " << total << " B vs the largest measured peak " << max_peak << " B";
  EXPECT_GE(double(total), max_peak * (1 - std::min(tolerance, kUnder)))
      << label << ": plan " << total << " B under the largest measured peak " << max_peak << " B";
  EXPECT_LE(double(m.peak_bytes), double(total) * (1 + tolerance))
      << label << ": plan " << total << " B vs measured peak " << m.peak_bytes << " B on rank "
      << world()->rank();
  EXPECT_LE(rel_err(double(fwd_plan), double(m.after_forward_bytes)), tolerance)
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

// p-MoD (its default schedule on 4 layers: each layer's own kept share of the image tokens) and PyramidDrop (stages
// at layers 1 and 2 keeping 1/2 and 1/4 of the image tokens; no router), planned from their mod.rule as gmod plan does.
static MemoryPlanInputs from_rule(const std::string& rule) {
  MemoryPlanInputs in = gmod::testing::small_plan_inputs(1, 1);
  TrainConfig cfg;
  cfg.mod.enabled = true;
  cfg.mod.rule = rule;
  const MemoryPlanInputs r = plan_inputs_from_config(cfg, in.model, 1);
  in.mod_layers = r.mod_layers, in.mod_router = r.mod_router, in.mod_rule = r.mod_rule;
  in.mod_kept_by_layer = r.mod_kept_by_layer, in.mod_kept_fraction = r.mod_kept_fraction;
  return in;
}

TEST(MemoryPlanMeasured, PModZero1) {
  const MemoryPlanInputs in = from_rule("pmod");
  ASSERT_EQ(in.mod_router, "pmod");
  check(in, "p-MoD");
}

TEST(MemoryPlanMeasured, PDropZero1) {
  const MemoryPlanInputs in = from_rule("pdrop:1,2:0.5,0.25");
  ASSERT_EQ(in.mod_router, "pdrop");
  ASSERT_EQ(in.mod_layers, (std::vector<int>{1, 2, 3}));
  check(in, "PyramidDrop");
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

// Optimizer offload at ZeRO-1 and ZeRO-2, fp32 and bf16 (the split is checked in check()).
TEST(MemoryPlanMeasured, OffloadFp32Zero1) {
  MemoryPlanInputs in = gmod::testing::small_plan_inputs(1, 1);
  in.offload = "cpu";
  check(in, "offload");
}

TEST(MemoryPlanMeasured, OffloadBf16Zero2) {
  MemoryPlanInputs in = gmod::testing::small_plan_inputs(1, 2, "bf16");
  in.offload = "cpu";
  check(in, "offload");
}

TEST(MemoryPlanMeasured, OffloadStatesHeavyFp32Zero0) {  // the peak is the optimizer step, offloaded
  MemoryPlanInputs in = gmod::testing::small_plan_inputs(1, 0);
  in.micro_batch = 1;
  in.seq_len = 32;
  in.offload = "cpu";
  check(in, "short batch offload");
}

// ZeRO-3 (the plan's stage-3 terms: parameter shard, persistent units + prefetch + 1 gathered layers, the
// persistent units' and the running unit's gradients, a reduction in flight), with activation checkpointing
// off and on, without reshard after forward, and at prefetch 2; within 3%, tighter than the other stages'
// 10%.
TEST(MemoryPlanMeasured, Zero3Fp32) { check(gmod::testing::small_plan_inputs(1, 3), "ZeRO-3", 0.03); }

TEST(MemoryPlanMeasured, Zero3Fp32Checkpointing) {
  MemoryPlanInputs in = gmod::testing::small_plan_inputs(1, 3);
  in.checkpointing = "full";
  check(in, "ZeRO-3 checkpointing", 0.03);
}

TEST(MemoryPlanMeasured, Zero3Bf16Offload) {
  MemoryPlanInputs in = gmod::testing::small_plan_inputs(1, 3, "bf16");
  in.offload = "cpu";
  check(in, "ZeRO-3 offload", 0.03);
}

TEST(MemoryPlanMeasured, Zero3Bf16Checkpointing) {
  MemoryPlanInputs in = gmod::testing::small_plan_inputs(1, 3, "bf16");
  in.checkpointing = "full";
  check(in, "ZeRO-3 bf16 checkpointing", 0.03);
}

TEST(MemoryPlanMeasured, Zero3NoReshardAfterForward) {
  MemoryPlanInputs in = gmod::testing::small_plan_inputs(1, 3);
  in.zero3_reshard_after_forward = false;
  check(in, "ZeRO-3 no reshard", 0.03);
}

TEST(MemoryPlanMeasured, Zero3Prefetch2Checkpointing) {
  MemoryPlanInputs in = gmod::testing::small_plan_inputs(1, 3);
  in.zero3_prefetch = 2;
  in.checkpointing = "full";
  check(in, "ZeRO-3 prefetch 2 checkpointing", 0.03);
}

// LoRA on the γ-MoD model (model/lora.h): frozen LLM weights without gradient, master or moments; adapters (with
// dropout, whose masks are saved) and the router train.
TEST(MemoryPlanMeasured, LoraGammaModZero1) {
  MemoryPlanInputs in = gmod::testing::small_plan_inputs(1, 1);
  in.mod_layers = {1, 2};
  in.mod_kept_fraction = 1.0 - 0.5 * 16.0 / 128.0;
  in.lora_r = 8;
  in.lora_targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  in.lora_dropout = 0.05;
  check(in, "lora");
}

TEST(MemoryPlanMeasured, LoraBf16Zero2) {
  MemoryPlanInputs in = gmod::testing::small_plan_inputs(1, 2, "bf16");
  in.lora_r = 16;
  in.lora_targets = {"q_proj", "v_proj"};
  check(in, "lora bf16");
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

// The memory plan's LLaVA-HR tower activations (trainer/plan/tower_activation_plan.h) against measured peaks:
// real training steps of a tiny LLaVA-HR model (configs/tiny_llava_hr.json's shapes: CLIP 4 x 32 at 336 px,
// ConvNeXt [8, 16, 24, 32] at 384 px, 576 image tokens, a 5-layer LLM of width 32; random init, towers and
// stitches trained, the real DataParallelOptimizer over MPI) are measured with MemoryTracker, with activation
// checkpointing off and on (on: LLM layers and the tower's units, CLIP layers and ConvNeXt stages, as gmod
// train does), in fp32 and bf16. The towers dominate this model's activations, so the check is mostly the tower
// estimate's.
//
// Which way the tolerance leans: the plan is what `gmod plan` answers "fits" with, so it must not promise less
// than a run takes. On every rank its peak and its end-of-forward total may exceed the measurement by up to 10%
// (kernel temporaries the plan counts at their largest) but fall short by at most 3% (the small transients it
// leaves out). bf16 on the CPU runs the ConvNeXt convolutions through oneDNN on AVX-512 machines and through
// ATen's own kernels on AVX2 ones, with different backward temporaries: the plan models both (ConvKernels in
// trainer/plan/tower_activation_plan.h, chosen by what this process runs), and ctest runs this binary a second
// time under AVX2 (mpi_memory_plan_hr_np2.lower_isa, tests/lower_isa.sh).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "model/cpu_kernels.h"
#include "parallel/mpi_comm.h"
#include "trainer/plan/memory_probe.h"
#include "trainer/plan/memory_tracker.h"

using namespace gmod;

namespace {

std::shared_ptr<MpiComm> world() {
  static auto c = std::make_shared<MpiComm>();
  return c;
}

LlavaConfig tiny_llava_hr_config() {
  LlavaConfig c;
  c.text.vocab_size = 800;
  c.text.hidden_size = 32;
  c.text.intermediate_size = 48;
  c.text.num_hidden_layers = 5;
  c.text.num_attention_heads = 4;
  c.text.num_key_value_heads = 2;
  c.text.max_position_embeddings = 1024;
  ClipVisionConfig v;
  v.hidden_size = 32;
  v.intermediate_size = 48;
  v.num_hidden_layers = 4;
  v.num_attention_heads = 4;
  v.image_size = 56;
  v.patch_size = 14;
  c.vision = v;
  MultipathConfig m;
  m.slow.depths = {1, 1, 2, 1};
  m.slow.dims = {8, 16, 24, 32};
  m.input_image_size = 384;
  m.stitch = true;
  c.multipath = m;
  c.image_token_id = 800;
  return c;
}

MemoryPlanInputs hr_inputs(const std::string& checkpointing, const std::string& dtype = "fp32") {
  MemoryPlanInputs in;
  in.model = tiny_llava_hr_config();
  in.world = world()->world_size();
  in.stage = 2;
  in.dtype = dtype;
  in.micro_batch = 1;
  in.seq_len = 640;
  in.images_per_sample = 1;
  in.supervised_fraction = 0.05;
  in.train_vision = true;
  in.checkpointing = checkpointing;
  return in;
}

// How far the plan may lie above and below a measurement (see the header).
constexpr double kOver = 0.10, kUnder = 0.03;

void expect_conservative(double plan, double measured, const std::string& what, double over = kOver) {
  EXPECT_LE(plan, measured * (1 + over)) << what << ": plan " << plan << " B over measured " << measured << " B";
  EXPECT_GE(plan, measured * (1 - kUnder)) << what << ": plan " << plan << " B under measured " << measured << " B";
}

void check(const MemoryPlanInputs& in, const char* label, double over = kOver) {
  const MemoryPlan plan = plan_memory(in);
  const MemoryMeasurement m = measure_training_memory(in, world());
  int64_t fwd_plan = 0;  // everything of the forward phase but the per-chunk loss transient, freed by then
  for (const auto& ph : plan.phases)
    if (ph.name == "forward (loss)") {
      fwd_plan = ph.bytes;
      for (const auto& t : ph.terms)
        if (t.name == "loss_transient") fwd_plan -= t.bytes;
    }
  if (world()->rank() == 0) {
    std::printf(
        "[%s] world %d ZeRO-%d %s checkpointing %s: measured peak %s, plan %s (%s, %+.1f%%); after forward "
        "measured %s, plan %s (%+.1f%%)\n",
        label, in.world, in.stage, in.dtype.c_str(), in.checkpointing.c_str(),
        format_bytes(double(m.peak_bytes)).c_str(), format_bytes(double(plan.total)).c_str(),
        plan.peak_phase.c_str(), 100.0 * (double(plan.total) - double(m.peak_bytes)) / double(m.peak_bytes),
        format_bytes(double(m.after_forward_bytes)).c_str(), format_bytes(double(fwd_plan)).c_str(),
        100.0 * (double(fwd_plan) - double(m.after_forward_bytes)) / double(m.after_forward_bytes));
    for (const auto& ph : plan.phases) {
      std::printf("    phase %-20s %12lld\n", ph.name.c_str(), (long long)ph.bytes);
      for (const auto& t : ph.terms)
        std::printf("        %-26s %12lld\n", t.name.c_str(), (long long)t.bytes);
    }
  }
  const std::string where = std::string(label) + " " + in.dtype + " checkpointing " + in.checkpointing + ", rank " +
                            std::to_string(world()->rank()) + " (CPU bf16 kernels: " +
                            (in.cpu_bf16_onednn ? "oneDNN" : "ATen") + ", ATen " + cpu_capability() + ")";
  expect_conservative(double(plan.total), double(m.peak_bytes), where + ", peak", over);
  expect_conservative(double(fwd_plan), double(m.after_forward_bytes), where + ", after the forward");
}

}  // namespace

TEST(MemoryPlanMeasuredLlavaHr, TrainedTowersNoCheckpointing) { check(hr_inputs("none"), "LLaVA-HR"); }
TEST(MemoryPlanMeasuredLlavaHr, TrainedTowersFullCheckpointing) { check(hr_inputs("full"), "LLaVA-HR"); }
// bf16 on CPU: the ConvNeXt blocks' backward keeps fp32 temporaries (tower_activation_plan.cpp).
TEST(MemoryPlanMeasuredLlavaHr, Bf16TrainedTowersNoCheckpointing) {
  check(hr_inputs("none", "bf16"), "LLaVA-HR");
}
TEST(MemoryPlanMeasuredLlavaHr, Bf16TrainedTowersFullCheckpointing) {
  check(hr_inputs("full", "bf16"), "LLaVA-HR");
}
// Wider ConvNeXt stages: the bf16 backward's per-pixel and per-channel temporaries weigh differently than above.
// With oneDNN the plan is as close as above (-1.4%); with ATen's kernels (AVX2) it over-estimates (+20.6%: the
// per-channel part of the ATen path's term is an upper bound, tower_activation_plan.cpp), so here it must stay
// conservative and within 25%.
TEST(MemoryPlanMeasuredLlavaHr, Bf16WiderConvNextFullCheckpointing) {
  MemoryPlanInputs in = hr_inputs("full", "bf16");
  in.model.multipath->slow.dims = {24, 32, 40, 48};
  check(in, "LLaVA-HR wide ConvNeXt", in.cpu_bf16_onednn ? kOver : 0.25);
}

// The memory plan's LLaVA-HR tower activations (trainer/plan/tower_activation_plan.h) against measured peaks:
// real training steps of a tiny LLaVA-HR model (configs/tiny_llava_hr.json's shapes: CLIP 4 x 32 at 336 px,
// ConvNeXt [8, 16, 24, 32] at 384 px, 576 image tokens, a 5-layer LLM of width 32; random init, towers and
// stitches trained, the real DataParallelOptimizer over MPI) are measured with MemoryTracker, with activation
// checkpointing off and on (on: LLM layers and the tower's units, CLIP layers and ConvNeXt stages, as gmod
// train does), in fp32 and bf16. The plan's per-rank peak and its end-of-forward total must be within 10% of the measurement on
// every rank. The towers dominate this model's activations, so the check is mostly the tower estimate's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

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

double rel_err(double plan, double measured) { return std::fabs(plan - measured) / measured; }

void check(const MemoryPlanInputs& in, const char* label) {
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
  EXPECT_LE(rel_err(double(plan.total), double(m.peak_bytes)), 0.10)
      << label << ": plan " << plan.total << " B vs measured peak " << m.peak_bytes << " B on rank "
      << world()->rank();
  EXPECT_LE(rel_err(double(fwd_plan), double(m.after_forward_bytes)), 0.10)
      << label << ": plan after forward " << fwd_plan << " B vs measured " << m.after_forward_bytes
      << " B on rank " << world()->rank();
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

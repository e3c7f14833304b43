// The memory plan's Qwen2.5-VL encoder terms (trainer/plan/tower_costs.cpp, the TowerCosts of its native-resolution
// tower) against measured peaks: real training steps of the tiny Qwen2.5-VL (tests/fixtures/qwen2_5_vl/data/model's
// config: encoder 4 blocks of width 32 with window attention and two full-attention blocks, 2x2 merger, a 2-layer
// Qwen2 LLM of width 32; random init, encoder trained, the real data-parallel strategy over MPI), each image a
// 24 x 32 patch grid (max_pixels 3072 at patch 2: 768 patches, 192 LLM tokens), measured with MemoryTracker. The
// encoder dominates this model's activations, so the check is mostly the tower estimate's. Held: fp32 without
// activation checkpointing (one and two images); the cases below the DISABLED_ line are not (figures there). Bounds as mpi_memory_plan_hr's (its header says which way they lean): the
// plan may exceed a measurement by 10% and fall short of it by 3%.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "model/config.h"
#include "parallel/mpi_comm.h"
#include "tests/common/paths.h"
#include "trainer/plan/memory_probe.h"
#include "trainer/plan/memory_tracker.h"
#include "trainer/plan/tower_costs.h"

using namespace gmod;

namespace {

std::shared_ptr<MpiComm> world() {
  static auto c = std::make_shared<MpiComm>();
  return c;
}

MemoryPlanInputs qwen_inputs(const std::string& checkpointing, const std::string& dtype, int images) {
  MemoryPlanInputs in;
  in.model = load_model_config(test::fixture("qwen2_5_vl/data/model"));
  in.world = world()->world_size();
  in.stage = 2;
  in.dtype = dtype;
  in.micro_batch = 1;
  in.seq_len = 256 * images;
  in.images_per_sample = images;
  in.supervised_fraction = 0.05;
  in.train_vision = true;
  in.checkpointing = checkpointing;
  in.visual.max_pixels = 3072;
  return in;
}

constexpr double kOver = 0.10, kUnder = 0.03;

void check(const MemoryPlanInputs& in) {
  const MemoryPlan plan = plan_memory(in);
  const MemoryMeasurement m = measure_training_memory(in, world());
  const std::string where = "Qwen2.5-VL " + std::to_string(in.images_per_sample) + " image(s), " + in.dtype +
                            " checkpointing " + in.checkpointing + ", rank " + std::to_string(world()->rank());
  if (world()->rank() == 0) {
    std::printf("[%s] measured steady %s, after forward %s, peak %s, plan %s (%s, %+.1f%%)\n", where.c_str(),
                format_bytes(double(m.steady_bytes)).c_str(), format_bytes(double(m.after_forward_bytes)).c_str(),
                format_bytes(double(m.peak_bytes)).c_str(), format_bytes(double(plan.total)).c_str(),
                plan.peak_phase.c_str(), 100.0 * (double(plan.total) - double(m.peak_bytes)) / double(m.peak_bytes));
    for (const auto& ph : plan.phases) {
      std::printf("    phase %-20s %12lld\n", ph.name.c_str(), (long long)ph.bytes);
      for (const auto& t : ph.terms) std::printf("        %-26s %12lld\n", t.name.c_str(), (long long)t.bytes);
    }
  }
  EXPECT_LE(double(plan.total), double(m.peak_bytes) * (1 + kOver)) << where << ": plan over the measured peak";
  EXPECT_GE(double(plan.total), double(m.peak_bytes) * (1 - kUnder)) << where << ": plan under the measured peak";
}

}  // namespace

TEST(MemoryPlanMeasuredQwen25VL, GridOfTheProbeHasThePlansPatches) {
  const auto in = qwen_inputs("none", "fp32", 1);
  const auto tc = tower_costs(in.model);
  ASSERT_TRUE(tc);
  const auto g = tc->grid(in.visual);
  EXPECT_EQ(g[0] * g[1] * g[2], tc->patches(in.visual));
  EXPECT_EQ(tc->llm_tokens(in.visual), 192);
}
TEST(MemoryPlanMeasuredQwen25VL, TrainedEncoderNoCheckpointing) { check(qwen_inputs("none", "fp32", 1)); }
TEST(MemoryPlanMeasuredQwen25VL, TwoImagesNoCheckpointing) { check(qwen_inputs("none", "fp32", 2)); }
// Not held yet (docs/plan.md, "Qwen2.5-VL"): with activation checkpointing the plan's tower backward is 10.6% under
// the measured peak at one image and 11.5% over at two (the recomputed block's backward grows by ~0.5 MiB an image
// against the plan's ~3.3 MiB, on top of ~2.8 MiB that does not grow with the images), and in bf16 without
// checkpointing 20.6% under. Run them with --gtest_also_run_disabled_tests to see the figures.
TEST(MemoryPlanMeasuredQwen25VL, DISABLED_TrainedEncoderFullCheckpointing) { check(qwen_inputs("full", "fp32", 1)); }
TEST(MemoryPlanMeasuredQwen25VL, DISABLED_TwoImagesFullCheckpointing) { check(qwen_inputs("full", "fp32", 2)); }
TEST(MemoryPlanMeasuredQwen25VL, DISABLED_Bf16TrainedEncoderNoCheckpointing) { check(qwen_inputs("none", "bf16", 1)); }

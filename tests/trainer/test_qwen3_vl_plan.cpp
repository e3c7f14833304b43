// The memory plan of Qwen3-VL (trainer/plan/tower_costs.cpp: the encoder with its DeepStack mergers reports
// its own costs; the Qwen3 text model's q_norm / k_norm in param_counts.cpp) against hand computations on the
// published Qwen3-VL-8B-Instruct config (configs/qwen3_vl_8b), and its parameter count and ZeRO-3 units
// against the model MultimodalLM builds from the tiny fixture config (tests/fixtures/qwen3_vl/full).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/llava.h"
#include "model/pretrained.h"
#include "model/unit_hooks.h"
#include "tests/common/paths.h"
#include "trainer/config/train_config.h"
#include "trainer/plan/memory_plan.h"

namespace gmod {
namespace test_qwen3_vl_plan {

LlavaConfig qwen3_8b() { return load_model_config(test::source_dir() + "/configs/qwen3_vl_8b"); }

// Hand computation for the published vision_config (D 1152, F 4304, 27 blocks, patch 16, temporal patch 2,
// merge 2x2, out 4096, 2304 learned positions, DeepStack after blocks 8, 16, 24):
//   patch_embed [1152, 3, 2, 16, 16] + bias = 1152 * 1536 + 1152                       = 1,770,624
//   pos_embed [2304, 1152]                                                               = 2,654,208
//   block: norm1, norm2 4*1152, qkv 3*1152^2 + 3*1152, proj 1152^2 + 1152,
//          fc1 4304*1152 + 4304, fc2 1152*4304 + 1152                                   = 15,239,504
//   merger: norm 2*1152, fc1 4608^2 + 4608, fc2 4096*4608 + 4096                         = 40,119,040
//   DeepStack merger: norm 2*4608, the same fc1 and fc2                                  = 40,125,952
//   encoder = 4,424,832 + 27 * 15,239,504 + 40,119,040 + 3 * 40,125,952                  = 576,388,336
// Text (Qwen3-8B: D 4096, I 12288, 36 layers, 32 heads and 8 KV heads of 128, q_norm / k_norm, vocab
// 151936, untied head):
//   layer = 2*4096*4096 + 2*4096*1024 + 3*4096*12288 + 2*4096 + 2*128                   = 192,946,432
//   LLM = 2 * 151936 * 4096 + 4096 + 36 * layer                                         = 8,190,735,360
// Total 8,767,123,696: the 8.77B parameters the published checkpoint holds.
constexpr int64_t kBlock = 15239504, kMerger = 40119040, kDeepStack = 40125952, kEncoder = 576388336,
                  kLayer = 192946432, kLlm = 8190735360;

TEST(Qwen3VLPlan, ParamCountsOfThePublished8BByHand) {
  const LlavaConfig c = qwen3_8b();
  ASSERT_TRUE(c.qwen3_vision.has_value());
  const ParamCounts pc = count_params(c, {}, "gamma_shared");
  EXPECT_EQ(pc.vision, kEncoder);
  EXPECT_EQ(pc.projector, 0);
  EXPECT_EQ(pc.llm, kLlm);
  EXPECT_EQ(pc.total(), 8767123696);
  EXPECT_EQ(pc.vision_unit, kDeepStack) << "a DeepStack merger is the encoder's largest unit";
  EXPECT_EQ(pc.vision_hooked, 27 * kBlock + kMerger + 3 * kDeepStack);
}

// The encoder's units as ZeRO-3 forms them: 27 blocks, 3 DeepStack mergers and the merger (hooked); the patch
// embedding and the learned positions persistent.
TEST(Qwen3VLPlan, Zero3UnitsAreTheBlocksAndEveryMerger) {
  MemoryPlanInputs in;
  in.model = qwen3_8b();
  in.stage = 3;
  in.world = 8;
  in.train_vision = true;
  const ParamCounts pc = count_params(in.model, {}, "gamma_shared");
  const Zero3Units u = zero3_units(pc, in.model, in);
  EXPECT_EQ(u.count, 27 + 3 + 1 + 36);
  EXPECT_EQ(u.hooked, 27 * kBlock + kMerger + 3 * kDeepStack + 36 * kLayer);
  EXPECT_EQ(u.max_unit, kLayer);
  const MemoryPlan p = plan_memory(in);
  EXPECT_EQ(p.zero3_persistent_params, 1770624 + 2654208 + 2 * 151936 * 4096 + 4096);
}

// Pixels and tokens at patch 16: max_pixels 1003520 gives 1003520 / (32 * 32) = 980 merge blocks of 4 patches
// = 3920 patches of 3*2*16*16 = 1536 values and 980 LLM tokens; 8 frames are 4 temporal patches.
TEST(Qwen3VLPlan, PixelsAndTokensOfAnImageAndAVideo) {
  const auto tc = tower_costs(qwen3_8b());
  ASSERT_TRUE(tc);
  VisualInputs image{1003520, 1}, video{1003520, 8};
  EXPECT_EQ(tc->patches(image), 3920);
  EXPECT_EQ(tc->llm_tokens(image), 980);
  EXPECT_EQ(tc->pixel_elements(image), 3920 * 1536);
  EXPECT_EQ(tc->patches(video), 4 * 3920);
  const auto g = tc->grid(image);
  EXPECT_EQ(g[0] * g[1] * g[2], 3920);
}

// configs/qwen3_vl_8b_gamma_mod.json as `gmod plan` reads it, and a trained encoder's saved activations by
// hand.
TEST(Qwen3VLPlan, GammaModConfigPlanByHand) {
  const std::string path = test::source_dir() + "/configs/qwen3_vl_8b_gamma_mod.json";
  std::ifstream f(path);
  ASSERT_TRUE(f) << path;
  TrainConfig cfg = train_config_from_json(nlohmann::json::parse(f, nullptr, true, true), {}, path);
  MemoryPlanInputs in = plan_inputs_from_config(cfg, qwen3_8b(), 8, VisualInputs{1003520, 1});
  EXPECT_EQ(in.micro_batch, 16);
  EXPECT_EQ(in.mod_layers.size(), 32u);
  EXPECT_DOUBLE_EQ(in.mod_kept_fraction, 1.0 - 0.3 * 980.0 / 2048.0);
  const MemoryPlan p = plan_memory(in);
  EXPECT_EQ(p.term_bytes("batch_inputs"), 16 * 2048 * 18 + int64_t(16) * 3920 * 1536 * (4 + 2));
  EXPECT_EQ(p.params_trainable, kLlm + 2 * 4096) << "LLM + γ-MoD's shared router [2, D]; encoder frozen";

  // A trained encoder on 16 images (N = 16 * 3920 = 62720 patches, bf16, head_dim 72) saves, without
  // checkpointing:
  //   per block: 2N(8*1152 + 2*4304) + 16N (two LayerNorms' mean, rstd) + 4*16*N (log-sum-exp) = N * 35728
  //   stem: conv3d input 2*N*1536, taps 32N, tap weights 16N, rotary cos/sin 8*N*72            = N * 3696
  //   merger: 8*N*1152 + 8N;  each DeepStack level: 8*N*1152 + 8*N/4, and its output 2*(N/4)*4096
  const int64_t N = 16 * 3920;
  const int64_t block = N * 35728, stem = N * 3696, merger = N * (8 * 1152 + 8);
  const int64_t level = N * 8 * 1152 + 8 * (N / 4) + 2 * (N / 4) * 4096;
  const auto tc = tower_costs(in.model);
  const TowerActivations full = tc->activations(16, in.visual, 2, true, false);
  EXPECT_EQ(full.saved, stem + merger + 3 * level + 27 * block);
  EXPECT_EQ(full.largest_unit, block);
  EXPECT_EQ(tc->activations(16, in.visual, 2, true, true).saved,
            stem + merger + 3 * level + 27 * N * 2 * 1152);
  EXPECT_EQ(tc->activations(16, in.visual, 2, false, true).saved, 0) << "a frozen encoder saves nothing";
}

// The counts equal the parameters of the model MultimodalLM builds from the tiny fixture config, and the
// encoder's hooked units are the built model's, in order.
TEST(Qwen3VLPlan, ParamCountsAndUnitsMatchTheBuiltTinyModel) {
  const LlavaConfig c = load_model_config(test::fixture("qwen3_vl/full"));
  auto m = std::make_shared<MultimodalLM>(c);  // hooked_units walks named_modules: needs a shared module
  int64_t n = 0, vision = 0;
  for (const auto& p : m->named_parameters()) {
    n += p.value().numel();
    if (p.key().rfind("vision.", 0) == 0) vision += p.value().numel();
  }
  const ParamCounts pc = count_params(c, {}, "gamma_shared");
  EXPECT_EQ(pc.vision, vision);
  EXPECT_EQ(pc.total(), n);
  std::vector<int64_t> built;
  for (const auto& u : hooked_units(*m)) {
    int64_t k = 0;
    for (const auto& p : u->parameters()) k += p.numel();
    built.push_back(k);
  }
  const auto planned = tower_costs(c)->hooked_units();
  ASSERT_GE(built.size(), planned.size());
  const std::vector<int64_t> tower(built.begin(),
                                   built.begin() + static_cast<std::ptrdiff_t>(planned.size()));
  EXPECT_EQ(tower, planned) << "the encoder's units come first in hooked_units, in the order they run";
}

}  // namespace test_qwen3_vl_plan
}  // namespace gmod

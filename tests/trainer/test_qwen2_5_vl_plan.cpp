// The memory plan of Qwen2.5-VL (trainer/plan/tower_costs.h: the encoder reports its own costs) against hand
// computations on the published Qwen2.5-VL-7B-Instruct config (configs/qwen2_5_vl_7b), and its parameter count
// against the model MultimodalLM builds from the tiny fixture config.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/llava.h"
#include "model/pretrained.h"
#include "tests/common/paths.h"
#include "trainer/config/train_config.h"
#include "trainer/plan/memory_plan.h"

using namespace gmod;

namespace {

LlavaConfig qwen7b() { return load_model_config(test::source_dir() + "/configs/qwen2_5_vl_7b"); }

// Hand computation for the published vision_config (D 1280, F 3420, 32 blocks, 16 heads, patch 14, temporal patch
// 2, merge 2x2, out 3584):
//   patch_embed [1280, 3, 2, 14, 14]                    = 1280 * 1176                       = 1,505,280
//   block: norms 2*1280, qkv 3*1280^2 + 3*1280, proj 1280^2 + 1280, gate/up 2*(3420*1280 + 3420),
//          down 1280*3420 + 1280                                                             = 19,702,200
//   merger: ln_q 1280, mlp.0 5120^2 + 5120, mlp.2 3584*5120 + 3584                           = 44,574,464
//   encoder = 1,505,280 + 32 * 19,702,200 + 44,574,464                                       = 676,550,144
// Text (Qwen2.5-7B: D 3584, I 18944, 28 layers, 28 heads, 4 KV heads of 128, vocab 152064, untied head):
//   layer = 2*3584^2 + 2*3584*512 + (3584 + 2*512) + 3*3584*18944 + 2*3584                  = 233,057,792
//   LLM = 2 * 152064 * 3584 + 3584 + 28 * layer                                             = 7,615,616,512
// Total 8,292,166,656: the 8.29B parameters the published checkpoint holds.
constexpr int64_t kBlock = 19702200, kMerger = 44574464, kEncoder = 676550144, kLayer = 233057792,
                  kLlm = 7615616512;

TEST(Qwen25VLPlan, ParamCountsOfThePublished7BByHand) {
  const LlavaConfig c = qwen7b();
  ASSERT_TRUE(c.qwen_vision);
  const ParamCounts pc = count_params(c, {}, "gamma_shared");
  EXPECT_EQ(pc.vision, kEncoder);
  EXPECT_EQ(pc.projector, 0);
  EXPECT_EQ(pc.llm, kLlm);
  EXPECT_EQ(pc.total(), 8292166656);
  EXPECT_EQ(pc.vision_unit, kMerger) << "the merger is the encoder's largest unit";
  EXPECT_EQ(pc.vision_hooked, 32 * kBlock + kMerger);
}

// The encoder's units as ZeRO-3 forms them: 32 blocks and the merger (hooked), the patch embedding persistent.
TEST(Qwen25VLPlan, Zero3UnitsAreTheBlocksAndTheMerger) {
  MemoryPlanInputs in;
  in.model = qwen7b();
  in.stage = 3;
  in.world = 8;
  in.train_vision = true;
  const ParamCounts pc = count_params(in.model, {}, "gamma_shared");
  const Zero3Units u = zero3_units(pc, in.model, in);
  EXPECT_EQ(u.count, 32 + 1 + 28);
  EXPECT_EQ(u.hooked, 32 * kBlock + kMerger + 28 * kLayer);
  EXPECT_EQ(u.max_unit, kLayer);
  const MemoryPlan p = plan_memory(in);
  // Persistent: the patch embedding, the embeddings, the final norm and the head.
  EXPECT_EQ(p.zero3_persistent_params, 1505280 + 2 * 152064 * 3584 + 3584);
  in.train_vision = false;  // a frozen encoder has no unit
  EXPECT_EQ(zero3_units(pc, in.model, in).count, 28);
}

// Pixels and tokens: max_pixels 1003520 (28*28*1280) gives 1280 merge blocks of 4 patches = 5120 patches of
// 3*2*14*14 = 1176 values and 1280 LLM tokens; 8 frames are 4 temporal patches: 20480 patches, 5120 tokens.
TEST(Qwen25VLPlan, PixelsAndTokensOfAnImageAndAVideo) {
  const auto tc = tower_costs(qwen7b());
  ASSERT_TRUE(tc);
  VisualInputs image{1003520, 1}, video{1003520, 8}, odd{1003520 + 783, 3};
  EXPECT_EQ(tc->patches(image), 5120);
  EXPECT_EQ(tc->llm_tokens(image), 1280);
  EXPECT_EQ(tc->pixel_elements(image), 5120 * 1176);
  EXPECT_EQ(tc->patches(video), 4 * 5120);
  EXPECT_EQ(tc->llm_tokens(video), 5120);
  EXPECT_EQ(tc->patches(odd), 2 * 5120) << "whole merge blocks; 3 frames fill 2 temporal patches";
}

// The plan of configs/qwen2_5_vl_7b_gamma_mod.json as `gmod plan` reads it: the batch's pixel values (fp32 and the
// bf16 copy) in batch_inputs, the MoD kept share from the image's 1280 tokens of 2048, and a trained encoder's
// saved activations by hand.
TEST(Qwen25VLPlan, GammaModConfigPlanByHand) {
  const std::string path = test::source_dir() + "/configs/qwen2_5_vl_7b_gamma_mod.json";
  std::ifstream f(path);
  ASSERT_TRUE(f) << path;
  TrainConfig cfg = train_config_from_json(nlohmann::json::parse(f, nullptr, true, true), {}, path);
  MemoryPlanInputs in = plan_inputs_from_config(cfg, qwen7b(), 8, VisualInputs{1003520, 1});
  EXPECT_EQ(in.images_per_sample, 1);
  EXPECT_EQ(in.micro_batch, 16);
  EXPECT_EQ(in.seq_len, 2048);
  EXPECT_EQ(in.mod_layers.size(), 24u);
  // γ-MoD skips skip_frac 0.3 of the routable (image) tokens: 1 - 0.3 * 1280 / 2048.
  EXPECT_DOUBLE_EQ(in.mod_kept_fraction, 1.0 - 0.3 * 1280.0 / 2048.0);
  const MemoryPlan p = plan_memory(in);
  // input_ids, labels (int64), mask, roles per token + 16 images' pixels in fp32 and bf16.
  EXPECT_EQ(p.term_bytes("batch_inputs"), 16 * 2048 * 18 + int64_t(16) * 5120 * 1176 * (4 + 2));
  EXPECT_EQ(p.params_trainable, kLlm + 2 * 3584) << "LLM + γ-MoD's shared router [2, D]; encoder frozen";

  // A trained encoder on 16 images (N = 16 * 5120 = 81920 patches, bf16) saves, without checkpointing:
  //   per block: 2N(9*1280 + 4*3420) + 16*N*1280 + 8N + 4*16*N + 16N = N * (50400 + 20480 + 88)
  //   stem: conv3d input 2*N*1176 + rotary cos/sin 8*N*80;  merger: 8*N*1280 + 4N
  const int64_t N = 16 * 5120;
  const int64_t block = N * (2 * (9 * 1280 + 4 * 3420) + 16 * 1280 + 8 + 64 + 16);
  const int64_t stem = N * (2 * 1176 + 8 * 80), merger = N * (8 * 1280 + 4);
  const auto tc = tower_costs(in.model);
  const TowerActivations full = tc->activations(16, in.visual, 2, true, false);
  EXPECT_EQ(full.saved, stem + merger + 32 * block);
  EXPECT_EQ(full.largest_unit, block);
  // With checkpointing each block keeps only its input [N, 1280] bf16.
  EXPECT_EQ(tc->activations(16, in.visual, 2, true, true).saved, stem + merger + 32 * N * 2 * 1280);
  EXPECT_EQ(tc->activations(16, in.visual, 2, false, true).saved, 0) << "a frozen encoder saves nothing";
  in.train_vision = true;
  const MemoryPlan trained = plan_memory(in);
  // The config checkpoints (full): the plan keeps the blocks' inputs, and reports the encoder's whole saved set
  // in activations_saved; its backward is a phase of its own.
  EXPECT_EQ(trained.activations_saved - p.activations_saved, full.saved);
  bool tower_phase = false;
  for (const auto& ph : trained.phases) tower_phase = tower_phase || ph.name == "tower backward";
  EXPECT_TRUE(tower_phase);
}

TEST(Qwen25VLPlan, RefusesVisualTokensThatDoNotFitMaxLen) {
  MemoryPlanInputs in;
  in.model = qwen7b();
  in.seq_len = 2048;
  in.visual = VisualInputs{28 * 28 * 4096, 1};  // 4096 LLM tokens
  try {
    plan_memory(in);
    FAIL() << "4096 visual tokens in 2048";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("4096 LLM tokens"), std::string::npos) << e.what();
  }
}

// The counts equal the parameters of the model MultimodalLM builds from the tiny fixture config.
TEST(Qwen25VLPlan, ParamCountsMatchTheBuiltTinyModel) {
  const LlavaConfig c = load_model_config(test::fixture("qwen2_5_vl/full"));
  MultimodalLM m(c);
  int64_t n = 0, vision = 0;
  for (const auto& p : m.named_parameters()) {
    n += p.value().numel();
    if (p.key().rfind("vision.", 0) == 0) vision += p.value().numel();
  }
  const ParamCounts pc = count_params(c, {}, "gamma_shared");
  EXPECT_EQ(pc.vision, vision);
  EXPECT_EQ(pc.total(), n);
}

}  // namespace

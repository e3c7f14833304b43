// Qwen2.5-VL parts against transformers on committed fixtures (tests/fixtures/make_qwen2_5_vl_fixtures.py):
// the vision encoder's merged features within 1e-5 max abs and the gradient of pixel_values and of every
// parameter within 1e-4 relative L2 (the tolerances of test_hf_parity.cpp), for two images of different grids
// and a video whose windows cut; the M-RoPE 3-D position ids exactly and their cos/sin tables within 1e-6.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>
#include <set>

#include "model/json_file.h"
#include "model/qwen2_5_vl_vision.h"
#include "model/safetensors.h"
#include "tests/common/paths.h"

using namespace gmod;

namespace {

std::string vision_dir() { return test::fixture("qwen2_5_vl/vision"); }

std::shared_ptr<Qwen25VisionEncoder> load_vision() {
  const auto dir = vision_dir();
  const auto cfg = load_json_file(dir + "/config.json");
  auto enc = std::make_shared<Qwen25VisionEncoder>(
      Qwen25VisionConfig::from_json(cfg.at("vision_config"), dir + "/config.json"));
  enc->load(SafetensorsFile(dir + "/model.safetensors"), "visual.");
  return enc;
}

double rel_l2(const at::Tensor& a, const at::Tensor& ref) {
  return (a - ref).norm().item<double>() / std::max(ref.norm().item<double>(), 1e-30);
}

TEST(Qwen25Vision, FeaturesAndEveryGradientMatchTransformers) {
  auto enc = load_vision();
  SafetensorsFile ref(vision_dir() + "/reference.safetensors");
  auto px = ref.tensor("input.pixel_values").clone().requires_grad_(true);
  auto out = enc->features(px, ref.tensor("input.grid_thw"));
  ASSERT_EQ(out.sizes(), ref.tensor("output").sizes());
  const double err = (out - ref.tensor("output")).abs().max().item<double>();
  EXPECT_LT(err, 1e-5) << "max abs feature difference (features up to "
                       << ref.tensor("output").abs().max().item<double>() << ")";
  (out * ref.tensor("upstream")).sum().backward();
  EXPECT_LT(rel_l2(px.grad(), ref.tensor("grad.pixel_values")), 1e-4) << "gradient of pixel_values";
  int compared = 0;
  double worst = 0;
  std::string worst_name;
  for (const auto& p : enc->named_parameters()) {
    const auto name = "grad." + p.key();
    ASSERT_TRUE(ref.has(name)) << p.key() << " has no reference gradient";
    ASSERT_TRUE(p.value().grad().defined()) << p.key() << " has no gradient in gmod";
    const double r = rel_l2(p.value().grad(), ref.tensor(name));
    EXPECT_LT(r, 1e-4) << "gradient of " << p.key();
    if (r > worst) worst = r, worst_name = p.key();
    ++compared;
  }
  int refs = 0;
  for (const auto& n : ref.names()) refs += n.rfind("grad.", 0) == 0 && n != "grad.pixel_values";
  EXPECT_EQ(compared, refs) << "every transformers parameter has a gmod parameter";
  std::cout << "Qwen2.5-VL vision: max feature diff " << err << ", worst relative gradient diff " << worst
            << " (" << worst_name << ")\n";
}

// The fixture exercises what it claims: windows that really cut (several per frame, of different sizes), full
// attention in some blocks and windows in the others, a video of two frames.
TEST(Qwen25Vision, FixtureWindowsCutAndBothAttentionKindsRun) {
  auto enc = load_vision();
  SafetensorsFile ref(vision_dir() + "/reference.safetensors");
  const auto layout = Qwen25VisionLayout::of(ref.tensor("input.grid_thw"), enc->config);
  EXPECT_EQ(layout.frame_lengths, (std::vector<int64_t>{96, 16, 32, 32}));
  // 8x12 patches = 4x6 merge blocks in 3x3-block windows: 3x3, 3x3, 1x3, 1x3; 4x4: one; 4x8 video: 2x3 and
  // 2x1.
  EXPECT_EQ(layout.window_lengths, (std::vector<int64_t>{36, 36, 12, 12, 16, 24, 8, 24, 8}));
  EXPECT_FALSE(layout.window_index.equal(at::arange(layout.window_index.size(0), at::kLong)));
  EXPECT_EQ(enc->config.fullatt_block_indexes, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(enc->config.depth, 4);
}

TEST(Qwen25Vision, BlockCheckpointingGivesBitwiseTheSameGradients) {
  SafetensorsFile ref(vision_dir() + "/reference.safetensors");
  std::vector<at::Tensor> grads[2];
  for (int ck = 0; ck < 2; ++ck) {
    auto enc = load_vision();
    enc->checkpoint_blocks = ck == 1;
    auto px = ref.tensor("input.pixel_values").clone().requires_grad_(true);
    (enc->features(px, ref.tensor("input.grid_thw")) * ref.tensor("upstream")).sum().backward();
    grads[ck].push_back(px.grad());
    for (const auto& p : enc->parameters()) grads[ck].push_back(p.grad());
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) EXPECT_TRUE(grads[0][i].equal(grads[1][i])) << i;
}

TEST(Qwen25Vision, ConfigReadsPublishedFieldsAndRejectsBadOnes) {
  // The published Qwen2.5-VL-7B vision_config spells the channels in_chans and has no rope_parameters.
  auto j = nlohmann::json::parse(
      R"({"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
    "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2,
    "spatial_patch_size": 14, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
    "tokens_per_second": 2, "temporal_patch_size": 2})");
  const auto c = Qwen25VisionConfig::from_json(j, "config.json");
  EXPECT_EQ(c.patch_dim(), 3 * 2 * 14 * 14);
  EXPECT_EQ(c.window_units(), 4);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.head_dim(), 80);
  j["fullatt_block_indexes"] = {7, 32};
  EXPECT_THROW(Qwen25VisionConfig::from_json(j, "config.json"), std::invalid_argument);
  j["fullatt_block_indexes"] = {7};
  j["window_size"] = 14;
  EXPECT_THROW(Qwen25VisionConfig::from_json(j, "config.json"), std::invalid_argument);
}

TEST(Qwen25Vision, RejectsGridsThatDoNotFitThePixels) {
  auto enc = load_vision();
  const auto dim = enc->config.patch_dim();
  EXPECT_THROW(enc->features(at::zeros({16, dim}), at::tensor({1, 4, 6}, at::kLong).view({1, 3})),
               std::invalid_argument);
  EXPECT_THROW(enc->features(at::zeros({12, dim}), at::tensor({1, 3, 4}, at::kLong).view({1, 3})),
               std::invalid_argument);
  EXPECT_THROW(enc->features(at::zeros({16, dim + 1}), at::tensor({1, 4, 4}, at::kLong).view({1, 3})),
               std::invalid_argument);
}

}  // namespace

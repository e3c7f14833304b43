// gmod's ConvNeXt against timm's own (tests/fixtures/make_convnext_fixture.py: convnext_large_mlp's layout at
// tiny widths, every parameter random): the last stage's feature map within 1e-5 and every parameter's
// gradient within 1e-5 relative to its own norm, loaded from timm's state_dict names; LLaVA-HR's layer-scale
// name and named loading errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/convnext.h"
#include "model/convnext_weights.h"
#include "model/hf_names.h"
#include "model/safetensors.h"
#include "tests/common/paths.h"

using namespace gmod;

namespace {

ConvNextConfig fixture_config() {
  std::ifstream f(test::fixture("convnext/config.json"));
  nlohmann::json j;
  f >> j;
  ConvNextConfig c;
  c.depths = j.at("depths").get<std::vector<int>>();
  c.dims = j.at("dims").get<std::vector<int>>();
  c.norm_eps = j.at("norm_eps").get<double>();
  return c;
}

double rel_err(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(b.norm().item<double>(), 1e-30);
}

}  // namespace

TEST(ConvNext, FeaturesAndEveryGradientMatchTimm) {
  ConvNext net(fixture_config());
  load_convnext_weights(net, test::fixture("convnext/model.safetensors"));
  SafetensorsFile ref(test::fixture("convnext/reference.safetensors"));
  auto y = net.forward(ref.tensor("input"));
  auto want = ref.tensor("features");
  ASSERT_EQ(y.sizes(), want.sizes());
  EXPECT_LT((y - want).abs().max().item<double>(), 1e-5);
  (y * ref.tensor("w")).sum().backward();
  int compared = 0;
  for (const auto& p : net.named_parameters()) {
    const std::string r = "grad." + p.key();
    ASSERT_TRUE(ref.has(r)) << p.key() << " has no timm gradient";
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_LT(rel_err(p.value().grad(), ref.tensor(r)), 1e-5) << "gradient of " << p.key();
    ++compared;
  }
  EXPECT_EQ(compared, 70);  // every timm parameter but the 6 of the classifier head
}

TEST(ConvNext, StageCheckpointingGivesTheSameGradients) {
  SafetensorsFile ref(test::fixture("convnext/reference.safetensors"));
  std::vector<std::vector<at::Tensor>> grads;
  for (bool ckpt : {false, true}) {
    ConvNext net(fixture_config());
    load_convnext_weights(net, test::fixture("convnext/model.safetensors"));
    net.checkpoint_stages = ckpt;
    (net.forward(ref.tensor("input")) * ref.tensor("w")).sum().backward();
    grads.emplace_back();
    for (const auto& p : net.parameters()) grads.back().push_back(p.grad().clone());
  }
  for (size_t i = 0; i < grads[0].size(); ++i)
    EXPECT_TRUE(grads[0][i].equal(grads[1][i])) << "parameter " << i;
}

TEST(ConvNext, LlavaHrLayerScaleNameMapsToGamma) {
  EXPECT_EQ(*hf_to_gmod("model.vision_tower.slow_vision_tower.vision_tower.stages.2.blocks.5.weight"),
            "vision.slow_vision_tower.stages.2.blocks.5.gamma");
  EXPECT_EQ(*hf_to_gmod("model.vision_tower.slow_vision_tower.vision_tower.stages.2.blocks.5.conv_dw.weight"),
            "vision.slow_vision_tower.stages.2.blocks.5.conv_dw.weight");
  EXPECT_TRUE(hf_unused("model.vision_tower.slow_vision_tower.vision_tower.head.fc.weight"));
  EXPECT_EQ(gmod_to_hf("vision.slow_vision_tower.stages.2.blocks.5.gamma", HfLayout::kLlavaHr),
            "model.vision_tower.slow_vision_tower.vision_tower.stages.2.blocks.5.weight");
}

TEST(ConvNext, WrongShapeCheckpointListsEveryProblem) {
  ConvNextConfig c = fixture_config();
  c.dims = {8, 16, 24, 40};  // last stage wider than the checkpoint's
  ConvNext net(c);
  try {
    load_convnext_weights(net, test::fixture("convnext/model.safetensors"));
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("model.safetensors"), std::string::npos) << m;
    EXPECT_NE(m.find("stages.3.downsample.1.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("stages.3.blocks.0.mlp.fc1.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("shape mismatch"), std::string::npos) << m;
  }
}

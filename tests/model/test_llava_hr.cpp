// gmod's LLaVA-HR (model/multipath_tower.h) against the original LLaVA-HR code on committed fixtures
// (tests/fixtures/make_llava_hr_fixtures.py runs the original modules at random tiny weights): logits within
// 1e-5 on real tokens, loss within 1e-5, and every parameter's gradient within 1e-5 of the reference relative
// to that tensor's own norm (vision and adapter gradients are small). Cases: 768 px (equal 24 x 24 grids) and
// 1024 px (32 x 32) with trained towers and stitches, 384 px (clamped fast path, ConvNeXt grid upsampled)
// with frozen towers; a GQA LLM, left padding, three images in a batch. Also: the config's named errors,
// loading errors listing every problem, and tower activation checkpointing giving the same gradients.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "model/compose.h"
#include "model/hf_names.h"
#include "model/multipath_tower.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "tests/common/paths.h"
#include "tests/model/fixture_dir_edit.h"
#include "tests/model/tower_parity.h"

using namespace gmod;
namespace fs = std::filesystem;

namespace {

nlohmann::json read_json(const std::string& path) {
  return test::read_fixture_json(path, "make_llava_hr_fixtures.py");
}

class LlavaHrParity : public ::testing::TestWithParam<std::string> {};

TEST_P(LlavaHrParity, LogitsLossAndEveryGradientMatchTheOriginal) {
  const auto dir = test::fixture("llava_hr/" + GetParam());
  const auto meta = read_json(dir + "/reference.json");
  auto model = load_pretrained(dir);
  ASSERT_TRUE(model->config.multipath);
  EXPECT_EQ(model->config.image_seq_length(), meta.at("tokens_per_image").get<int>());
  if (meta.at("freeze_vision").get<bool>()) test::freeze_towers(*model);
  SafetensorsFile ref(dir + "/reference.safetensors");
  auto in = test::tower_fixture_inputs(ref, meta.at("pixel_repeat").get<int>());
  test::expect_fixture_parity(*model, in, ref, meta, {"k_proj.bias"}, GetParam());
}

TEST_P(LlavaHrParity, Bf16LogitsTrackTheOriginalBf16) {
  const auto dir = test::fixture("llava_hr/" + GetParam());
  test::expect_bf16_tracks_original(dir, read_json(dir + "/reference.json").at("pixel_repeat").get<int>(),
                                    GetParam());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LlavaHrParity,
                         ::testing::Values("hr768_trained", "hr1024_trained", "hr384_frozen"));

TEST(LlavaHr, TowerCheckpointingGivesBitwiseTheSameGradients) {
  test::expect_tower_checkpointing_bitwise(test::fixture("llava_hr/hr768_trained"), 8);
}

nlohmann::json hr_config() { return read_json(test::fixture("llava_hr/hr768_trained/config.json")); }

std::string config_error(const nlohmann::json& j) {
  try {
    parse_model_config(j, "hr/config.json");
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(LlavaHrConfig, ReadsTheMultipathFields) {
  const auto c = parse_model_config(hr_config(), "hr/config.json");
  ASSERT_TRUE(c.multipath);
  EXPECT_EQ(c.multipath->input_image_size, 768);
  EXPECT_EQ(c.multipath->fast_image_size(), 336);
  EXPECT_TRUE(c.multipath->stitch);
  EXPECT_EQ(c.multipath->slow.dims, (std::vector<int>{8, 16, 24, 32}));
  EXPECT_EQ(c.image_seq_length(), 576);
  EXPECT_EQ(c.image_input_size(), 768);
  auto j = hr_config();
  j["input_image_size"] = 1024;
  j.erase("vision_config_slow");  // the published name stands for convnext_large_mlp
  const auto big = parse_model_config(j, "hr/config.json");
  EXPECT_EQ(big.multipath->slow.dims, (std::vector<int>{192, 384, 768, 1536}));
  EXPECT_EQ(big.multipath->slow.depths, (std::vector<int>{3, 3, 27, 3}));
  EXPECT_EQ(big.image_seq_length(), 1024);
}

TEST(LlavaHrConfig, EveryProblemIsNamedInOneError) {
  auto j = hr_config();
  j["input_image_size"] = 1000;  // not a multiple of 32
  j.erase("vision_config_slow");
  j["vision_tower_slow"] = "resnet50.a1_in1k";
  j["vision_config"]["num_hidden_layers"] = 6;  // not four quarters
  const std::string m = config_error(j);
  EXPECT_NE(m.find("hr/config.json"), std::string::npos) << m;
  EXPECT_NE(m.find("input_image_size 1000 is not a positive multiple of 32"), std::string::npos) << m;
  EXPECT_NE(m.find("unknown vision_tower_slow 'resnet50.a1_in1k'"), std::string::npos) << m;
  EXPECT_NE(m.find("num_hidden_layers 6 is not a multiple of 4"), std::string::npos) << m;
  EXPECT_NE(m.find("3 problems"), std::string::npos) << m;
}

std::string copy_fixture(const test::TempDir& tmp, const std::function<bool(const std::string&)>& keep,
                         const std::function<void(nlohmann::json&)>& edit) {
  return test::copy_fixture_dir(tmp, "llava_hr/hr768_trained", "hr", keep, edit);
}

using test::load_error;

TEST(LlavaHrLoad, MissingConvNextWeightsAreNamed) {
  test::TempDir tmp;
  const auto dir = copy_fixture(
      tmp, [](const std::string& n) { return n.find("slow_vision_tower") == std::string::npos; },
      [](nlohmann::json&) {});
  const std::string m = load_error(dir);
  EXPECT_NE(m.find("checkpoint lacks tensors the model needs"), std::string::npos) << m;
  EXPECT_NE(m.find("vision.slow_vision_tower.stem.0.weight"), std::string::npos) << m;
}

TEST(LlavaHrLoad, MismatchedAdapterShapesAreAllListed) {
  test::TempDir tmp;
  const auto dir = copy_fixture(
      tmp, [](const std::string&) { return true; },
      [](nlohmann::json& j) {
        j["vision_config"]["hidden_size"] = 40, j["vision_config"]["intermediate_size"] = 48;
      });
  const std::string m = load_error(dir);
  EXPECT_NE(m.find("align_stages.0.fast_proj.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("align_stages_latent.2.gate.0.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("mm_projector.0.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("shape mismatch"), std::string::npos) << m;
}

TEST(LlavaHrLoad, ExportWritesTheOriginalLayoutAndReadsBack) {
  const auto dir = test::fixture("llava_hr/hr384_frozen");
  auto model = load_pretrained(dir);
  test::TempDir tmp;
  save_pretrained(*model, (tmp.path / "out").string());
  SafetensorsFile src(dir + "/model.safetensors"), out((tmp.path / "out/model.safetensors").string());
  for (const auto& n : src.names()) {
    if (hf_unused(n)) continue;
    ASSERT_TRUE(out.has(n)) << n << " not exported under its original name";
    EXPECT_TRUE(out.tensor(n).equal(src.tensor(n))) << n;
  }
  auto back = load_pretrained((tmp.path / "out").string());
  EXPECT_TRUE(back->config.multipath);
  EXPECT_FALSE(back->config.multipath->stitch);
  EXPECT_EQ(back->config.multipath->input_image_size, 384);
}

TEST(LlavaHrParts, ComposedFromPublishedStylePartsEqualsTheCheckpoint) {
  // tests/fixtures/llava_hr/parts: the hr384_frozen model as an LLM dir, a CLIP dir, a timm ConvNeXt dir
  // (timm's names, head included) and a stage-1 mm_projector.bin holding the projector and the align module.
  ModelParts p;
  const auto parts = test::fixture("llava_hr/parts");
  p.llm = parts + "/llm", p.vision = parts + "/clip", p.vision_slow = parts + "/convnext";
  p.projector = parts + "/mm_projector.bin";
  p.input_image_size = 384;
  p.freeze_vision = true;
  auto composed = load_composed(p);
  auto ref = load_pretrained(test::fixture("llava_hr/hr384_frozen"));
  ASSERT_TRUE(composed->config.multipath);
  EXPECT_EQ(composed->config.image_token_id, 64);
  auto a = composed->named_parameters(), b = ref->named_parameters();
  EXPECT_EQ(a.size(), b.size());
  for (const auto& x : b) {
    ASSERT_TRUE(a.contains(x.key())) << x.key();
    EXPECT_TRUE(a[x.key()].equal(x.value())) << x.key();
  }
}

TEST(LlavaHrParts, TrainedTowersStartTheStitchesAsTheIdentity) {
  // A frozen-tower stage-1 file has no stitches; with trained towers they start as LLaVA-HR initialises them
  // (zero output projections), so the composed model's features equal those without stitches.
  ModelParts p;
  const auto parts = test::fixture("llava_hr/parts");
  p.llm = parts + "/llm", p.vision = parts + "/clip", p.vision_slow = parts + "/convnext";
  p.projector = parts + "/mm_projector.bin";
  p.input_image_size = 384;
  auto frozen = load_composed(p);
  p.freeze_vision = false;
  auto trained = load_composed(p);
  auto mp = std::dynamic_pointer_cast<MultipathTower>(trained->vision);
  ASSERT_EQ(mp->stitches.size(), 3u);
  EXPECT_EQ(mp->stitches[0]->slow_proj_w.abs().max().item<double>(), 0.0);
  EXPECT_GT(mp->stitches[0]->slow_conv_w.abs().max().item<double>(), 0.0);
  at::NoGradGuard ng;
  auto px = at::randn({1, 3, 384, 384});
  EXPECT_TRUE(trained->image_features(px).allclose(frozen->image_features(px), 0, 0));
}

TEST(LlavaHrParts, ProblemsOfEveryPartAreListed) {
  ModelParts p;
  const auto parts = test::fixture("llava_hr/parts");
  p.llm = parts + "/llm", p.vision = parts + "/clip", p.vision_slow = parts + "/llm";  // not a ConvNeXt dir
  p.projector = parts + "/mm_projector.bin";
  p.input_image_size = 400;
  try {
    load_composed(p);
    FAIL() << "no error";
  } catch (const std::exception& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("llm/config.json has no 'architecture'"), std::string::npos) << m;
    EXPECT_NE(m.find("input_image_size 400 is not a positive multiple of 32"), std::string::npos) << m;
  }
}

}  // namespace

// gmod's Mini-Gemini (model/mgm_tower.h) against the original MGM code on committed fixtures
// (tests/fixtures/make_mgm_fixtures.py runs the original modules at random tiny weights): logits within 1e-5
// on real tokens, loss within 1e-5, and every parameter's gradient within 1e-5 of the reference relative to
// that tensor's own norm. Cases: MGM-HD's shape (image_grid 2 + global crop) with partly trained CLIP and
// ConvNeXt, the base shape (one crop) with frozen towers, grid 2 without the global crop with a trained
// ConvNeXt; a GQA LLM, left padding, three images in a batch. Also: bf16, the config's named errors, loading
// errors listing every problem, export in the original layout, and tower activation checkpointing giving the
// same gradients.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "model/compose.h"
#include "model/hf_names.h"
#include "model/mgm_tower.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "tests/common/paths.h"
#include "tests/model/fixture_dir_edit.h"
#include "tests/model/tower_parity.h"

using namespace gmod;
namespace fs = std::filesystem;

namespace {

nlohmann::json read_json(const std::string& path) {
  return test::read_fixture_json(path, "make_mgm_fixtures.py");
}

class MgmParity : public ::testing::TestWithParam<std::string> {};

TEST_P(MgmParity, LogitsLossAndEveryGradientMatchTheOriginal) {
  const auto dir = test::fixture("mgm/" + GetParam());
  const auto meta = read_json(dir + "/reference.json");
  auto model = load_pretrained(dir);
  ASSERT_TRUE(model->config.mgm);
  EXPECT_EQ(model->config.image_seq_length(), meta.at("tokens_per_image").get<int>());
  test::freeze_towers(*model);
  SafetensorsFile ref(dir + "/reference.safetensors");
  auto in = test::tower_fixture_inputs(ref, meta.at("pixel_repeat").get<int>());
  test::expect_fixture_parity(*model, in, ref, meta,
                              {"k_proj.bias", "vlm_uni_aux_projector.1.bias", "vlm_uni_aux_projector.0.bias"},
                              GetParam());
}

TEST_P(MgmParity, Bf16LogitsTrackTheOriginalBf16) {
  const auto dir = test::fixture("mgm/" + GetParam());
  test::expect_bf16_tracks_original(dir, read_json(dir + "/reference.json").at("pixel_repeat").get<int>(),
                                    GetParam());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MgmParity,
                         ::testing::Values("hd_trained", "base_frozen", "grid2_aux_trained"));

TEST(Mgm, TowerCheckpointingGivesBitwiseTheSameGradients) {
  test::expect_tower_checkpointing_bitwise(test::fixture("mgm/hd_trained"), 4);
}

TEST(Mgm, TrainableTowerPartsAreTheOriginals) {
  // MGM trains the mining projectors always, CLIP's second half with optimize_vision_tower, the last block of
  // each ConvNeXt stage with optimize_vision_tower_aux (mgm/train/train.py).
  auto hd = load_pretrained(test::fixture("mgm/hd_trained"));
  auto base = load_pretrained(test::fixture("mgm/base_frozen"));
  EXPECT_TRUE(hd->vision->is_adapter("mining.vlm_uni_val_projector.1.weight"));
  EXPECT_TRUE(hd->vision->is_adapter("vision_tower_aux.stages.2.blocks.1.gamma"));
  EXPECT_FALSE(hd->vision->is_adapter("vision_tower_aux.stages.2.blocks.0.gamma"));
  EXPECT_FALSE(hd->vision->is_adapter("vision_tower_aux.stem.0.weight"));
  EXPECT_TRUE(hd->vision->is_adapter("vision_model.encoder.layers.2.fc1.weight"));
  EXPECT_FALSE(hd->vision->is_adapter("vision_model.encoder.layers.1.fc1.weight"));
  EXPECT_TRUE(base->vision->is_adapter("mining.vlm_uni_query_projector.0.weight"));
  EXPECT_FALSE(base->vision->is_adapter("vision_tower_aux.stages.2.blocks.1.gamma"));
  EXPECT_FALSE(base->vision->is_adapter("vision_model.encoder.layers.3.fc1.weight"));
}

nlohmann::json mgm_config() { return read_json(test::fixture("mgm/hd_trained/config.json")); }

std::string config_error(const nlohmann::json& j) {
  try {
    parse_model_config(j, "mgm/config.json");
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(MgmConfig, ReadsTheFieldsAndThePublishedShapes) {
  const auto c = parse_model_config(mgm_config(), "mgm/config.json");
  ASSERT_TRUE(c.mgm);
  EXPECT_EQ(c.mgm->image_size_aux, 128);
  EXPECT_EQ(c.mgm->image_grid, 2);
  EXPECT_TRUE(c.mgm->image_global);
  EXPECT_EQ(c.mgm->aux.dims, (std::vector<int>{8, 16, 24, 32}));
  EXPECT_EQ(c.image_seq_length(), 5 * 16);
  EXPECT_EQ(c.image_input_size(), 128);
  EXPECT_TRUE(c.original_layout());
  // MGM-HD-7B's published shape: CLIP-L/336 in a 2 x 2 grid + global, OpenCLIP ConvNeXt-L at 1536 px.
  auto j = mgm_config();
  j.erase("vision_config_aux");
  j.erase("mm_hidden_size_aux");
  j["mm_vision_tower_aux"] = "model_zoo/OpenAI/openclip-convnext-large-d-320-laion2B-s29B-b131K-ft-soup";
  j["image_size_aux"] = 1536;
  j["vision_config"]["image_size"] = 336;
  j["max_position_embeddings"] = 4096;
  const auto hd = parse_model_config(j, "mgm/config.json");
  EXPECT_EQ(hd.mgm->aux.dims, (std::vector<int>{192, 384, 768, 1536}));
  EXPECT_EQ(hd.mgm->aux.depths, (std::vector<int>{3, 3, 27, 3}));
  EXPECT_EQ(hd.mgm->aux_channels(), 2880);
  EXPECT_EQ(hd.image_seq_length(), 5 * 576);
}

TEST(MgmConfig, EveryProblemIsNamedInOneError) {
  auto j = mgm_config();
  j.erase("vision_config_aux");
  j["mm_vision_tower_aux"] = "model_zoo/resnet50-in1k";  // unknown aux tower
  j["image_size_aux"] = 100;                             // not a multiple of 32
  j["image_grid"] = 1;                                   // with image_global true
  j["mm_vision_select_feature"] = "cls_patch";
  const std::string m = config_error(j);
  EXPECT_NE(m.find("mgm/config.json"), std::string::npos) << m;
  EXPECT_NE(m.find("unknown mm_vision_tower_aux 'model_zoo/resnet50-in1k'"), std::string::npos) << m;
  EXPECT_NE(m.find("image_size_aux 100 is not a multiple of 32"), std::string::npos) << m;
  EXPECT_NE(m.find("image_global needs image_grid >= 2"), std::string::npos) << m;
  EXPECT_NE(m.find("mm_vision_select_feature must be 'patch'"), std::string::npos) << m;
  EXPECT_NE(m.find("4 problems"), std::string::npos) << m;
  auto k = mgm_config();
  k["vision_config"]["image_size"] =
      84;  // CLIP grid 6: the stem grid 32 cut in 2 (16) is not a multiple of it
  k["mm_hidden_size_aux"] = 81;
  const std::string n = config_error(k);
  EXPECT_NE(n.find("is not a multiple of the CLIP grid 6"), std::string::npos) << n;
  EXPECT_NE(n.find("mm_hidden_size_aux 81 is not the ConvNeXt's summed stage widths 80"), std::string::npos)
      << n;
  auto l = mgm_config();
  l.erase("image_size_aux");
  EXPECT_NE(config_error(l).find("missing field 'image_size_aux'"), std::string::npos);
}

std::string copy_fixture(const test::TempDir& tmp, const std::function<bool(const std::string&)>& keep,
                         const std::function<void(nlohmann::json&)>& edit) {
  return test::copy_fixture_dir(tmp, "mgm/hd_trained", "mgm", keep, edit);
}

using test::load_error;

TEST(MgmLoad, MissingAuxWeightsAreNamed) {
  test::TempDir tmp;
  const auto dir = copy_fixture(
      tmp, [](const std::string& n) { return n.find("vision_tower_aux") == std::string::npos; },
      [](nlohmann::json&) {});
  const std::string m = load_error(dir);
  EXPECT_NE(m.find("checkpoint lacks tensors the model needs"), std::string::npos) << m;
  EXPECT_NE(m.find("vision.vision_tower_aux.stem.0.weight"), std::string::npos) << m;
}

TEST(MgmLoad, MismatchedShapesAreAllListed) {
  test::TempDir tmp;
  const auto dir = copy_fixture(
      tmp, [](const std::string&) { return true; },
      [](nlohmann::json& j) {
        j["vision_config_aux"]["dims"] = {8, 16, 24, 40};  // the last stage wider than the checkpoint's
        j.erase("mm_hidden_size_aux");
      });
  const std::string m = load_error(dir);
  EXPECT_NE(m.find("model.vision_tower_aux.vision_stages.3.downsample.1.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("model.vlm_uni_aux_projector.0.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("model.vlm_uni_val_projector.1.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("shape mismatch"), std::string::npos) << m;
}

TEST(MgmLoad, ExportWritesTheOriginalLayoutAndReadsBack) {
  const auto dir = test::fixture("mgm/hd_trained");
  auto model = load_pretrained(dir);
  test::TempDir tmp;
  const auto out_dir = (tmp.path / "out").string();
  save_pretrained(*model, out_dir);
  SafetensorsFile src(dir + "/model.safetensors"), out(out_dir + "/model.safetensors");
  EXPECT_EQ(src.names().size(), out.names().size());
  for (const auto& n : src.names()) {
    ASSERT_TRUE(out.has(n)) << n << " not exported under its original name";
    EXPECT_TRUE(out.tensor(n).equal(src.tensor(n))) << n;
  }
  const auto cfg = read_json(out_dir + "/config.json");
  EXPECT_EQ(cfg.at("model_type"), "mgm");
  EXPECT_EQ(cfg.at("mm_hidden_size_aux"), 80);
  auto back = load_pretrained(out_dir);
  ASSERT_TRUE(back->config.mgm);
  EXPECT_EQ(back->config.mgm->image_grid, 2);
  EXPECT_TRUE(back->config.mgm->image_global);
  EXPECT_TRUE(back->config.mgm->optimize_vision_tower_aux);
  EXPECT_EQ(back->config.mgm->image_size_aux, 128);
}

ModelParts hd_parts() {
  // tests/fixtures/mgm/parts: the hd_trained model as an LLM dir, a CLIP dir, an OpenCLIP ConvNeXt dir
  // (open_clip's names under visual.trunk., torch.save) and MGM's stage-1 mm_projector.bin (projector, mining
  // projectors and its copies of the towers).
  ModelParts p;
  const auto parts = test::fixture("mgm/parts");
  p.llm = parts + "/llm", p.vision = parts + "/clip",
  p.vision_aux = parts + "/openclip-convnext-large-d-320-tiny";
  p.projector = parts + "/mm_projector.bin";
  p.image_size_aux = 128, p.image_grid = 2, p.image_global = true;
  p.optimize_vision_tower = p.optimize_vision_tower_aux = true;
  return p;
}

TEST(MgmParts, ComposedFromPublishedStylePartsEqualsTheCheckpoint) {
  auto composed = load_composed(hd_parts());
  auto ref = load_pretrained(test::fixture("mgm/hd_trained"));
  ASSERT_TRUE(composed->config.mgm);
  EXPECT_EQ(composed->config.image_token_id, 64);
  EXPECT_EQ(composed->config.image_seq_length(), 80);
  auto a = composed->named_parameters(), b = ref->named_parameters();
  EXPECT_EQ(a.size(), b.size());
  for (const auto& x : b) {
    ASSERT_TRUE(a.contains(x.key())) << x.key();
    EXPECT_TRUE(a[x.key()].equal(x.value())) << x.key();
  }
}

TEST(MgmParts, WithoutMiningWeightsTheyStartAsMgmBuildsThem) {
  // A stage-1 file with only the projector: the mining projectors start as nn.LayerNorm / nn.Linear defaults.
  test::TempDir tmp;
  ModelParts p = hd_parts();
  auto full = load_composed(p);
  std::vector<std::pair<std::string, at::Tensor>> proj;
  for (const char* n : {"linear_1.weight", "linear_1.bias", "linear_2.weight", "linear_2.bias"})
    proj.emplace_back(std::string("multi_modal_projector.") + n,
                      full->named_parameters()[std::string("projector.") + n]);
  p.projector = (tmp.path / "projector.safetensors").string();
  save_safetensors(p.projector, proj);
  auto fresh = load_composed(p);
  auto params = fresh->named_parameters();
  EXPECT_TRUE(params["vision.mining.vlm_uni_aux_projector.0.weight"].equal(at::ones({80})));
  const auto w = params["vision.mining.vlm_uni_aux_projector.1.weight"];
  EXPECT_LE(w.abs().max().item<double>(), 1.0 / std::sqrt(80.0));
  EXPECT_GT(w.abs().max().item<double>(), 0.5 / std::sqrt(80.0));
  EXPECT_TRUE(
      params["projector.linear_1.weight"].equal(full->named_parameters()["projector.linear_1.weight"]));
}

TEST(MgmParts, ProblemsOfEveryPartAreListed) {
  ModelParts p = hd_parts();
  p.vision_aux = test::fixture("mgm/parts/clip");  // not an OpenCLIP directory
  p.image_size_aux = 100;
  try {
    load_composed(p);
    FAIL() << "no error";
  } catch (const std::exception& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no open_clip_config.json"), std::string::npos) << m;
    EXPECT_NE(m.find("unknown mm_vision_tower_aux"), std::string::npos) << m;
    EXPECT_NE(m.find("image_size_aux 100 is not a multiple of 32"), std::string::npos) << m;
  }
}

}  // namespace

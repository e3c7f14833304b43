// LLaVA-NeXT (AnyRes) against transformers' LlavaNextForConditionalGeneration on a committed fixture
// (tests/fixtures/make_llava_next_fixtures.py -> tests/fixtures/hf/llava_next_tiny): a batch with images of five
// aspect ratios (a pinpoint tie, a grid whose unpad extent needs transformers' rounding, rows and columns cut), a
// row with two images, a text-only row, right and left padding. Tolerances as test_hf_parity.cpp: logits 1e-5 max
// abs on real tokens, loss 1e-5, the gradient of every parameter 1e-4 relative (image_newline's included). The
// original LLaVA layout of the same weights (llava_llama, anyres, spatial_unpad, pinpoints as (width, height))
// loads to the same model.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "model/anyres_grid.h"
#include "model/hf_names.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "tests/common/paths.h"

using namespace gmod;

namespace {

const char* kCase = "hf/llava_next_tiny";

// The fixture's inputs, with transformers' [images, max tiles, 3, S, S] batch (zero tiles pad the shorter images)
// turned into gmod's [tiles, 3, S, S]: each image's own tiles, as many as its size gives.
ModelInputs inputs_from(const SafetensorsFile& ref, const LlavaConfig& c) {
  ModelInputs in;
  in.input_ids = ref.tensor("input.input_ids").clone();
  in.attention_mask = ref.tensor("input.attention_mask").to(at::kBool);
  in.labels = ref.tensor("input.labels").clone();
  in.image_sizes = ref.tensor("input.image_sizes").to(at::kLong);
  const auto pv = ref.tensor("input.pixel_values");
  std::vector<at::Tensor> tiles;
  for (int64_t i = 0; i < in.image_sizes.size(0); ++i) {
    const int h = in.image_sizes[i][0].item<int>(), w = in.image_sizes[i][1].item<int>();
    tiles.push_back(pv[i].narrow(0, 0, anyres_num_tiles(h, w, *c.anyres, c.vision->image_size)));
  }
  in.pixel_values = at::cat(tiles, 0).to(at::kFloat);
  return in;
}

// The fixture's weights and config as the original LLaVA code saves LLaVA-NeXT (llava-v1.6): model_type
// llava_llama, the LLM's fields at the top, mm_* fields, image_aspect_ratio anyres, mm_patch_merge_type
// spatial_unpad, pinpoints as (width, height) pairs in the Python text some configs hold, and its parameter names
// (model.*, model.mm_projector.{0,2}, model.vision_tower.vision_tower.vision_model.*, model.image_newline).
void write_original_layout(const std::string& from, const std::string& to) {
  std::ifstream f(from + "/config.json");
  const auto hf = nlohmann::json::parse(f);
  nlohmann::json j = hf["text_config"];
  j["architectures"] = {"LlavaLlamaForCausalLM"};
  j["model_type"] = "llava_llama";
  j["vision_config"] = hf["vision_config"];
  j["mm_hidden_size"] = hf["vision_config"]["hidden_size"];
  j["mm_projector_type"] = "mlp2x_gelu";
  j["mm_vision_select_layer"] = hf["vision_feature_layer"];
  j["mm_vision_select_feature"] = "patch";
  j["image_aspect_ratio"] = "anyres";
  j["mm_patch_merge_type"] = "spatial_unpad";
  std::string pins = "[";
  for (const auto& p : hf["image_grid_pinpoints"])  // (height, width) -> (width, height)
    pins += std::string(pins.size() > 1 ? ", (" : "(") + std::to_string(p[1].get<int>()) + ", " +
            std::to_string(p[0].get<int>()) + ")";
  j["image_grid_pinpoints"] = pins + "]";
  std::ofstream(to + "/config.json") << j.dump(2);
  SafetensorsFile w(from + "/model.safetensors");
  std::vector<std::pair<std::string, at::Tensor>> out;
  // transformers 5 writes its 4.x names (language_model.model.*, vision_tower.* without vision_model, ...); its
  // 5.x ones are listed too.
  const std::vector<std::pair<std::string, std::string>> renames = {
      {"language_model.model.", "model."},
      {"language_model.lm_head.", "lm_head."},
      {"multi_modal_projector.linear_1.", "model.mm_projector.0."},
      {"multi_modal_projector.linear_2.", "model.mm_projector.2."},
      {"vision_tower.vision_model.", "model.vision_tower.vision_tower.vision_model."},
      {"vision_tower.", "model.vision_tower.vision_tower.vision_model."},
      {"image_newline", "model.image_newline"},
      {"model.language_model.", "model."},
      {"model.multi_modal_projector.linear_1.", "model.mm_projector.0."},
      {"model.multi_modal_projector.linear_2.", "model.mm_projector.2."},
      {"model.vision_tower.vision_model.", "model.vision_tower.vision_tower.vision_model."},
      {"model.image_newline", "model.image_newline"},
      {"lm_head.", "lm_head."}};
  for (const auto& name : w.names()) {
    std::string renamed;
    for (const auto& [a, b] : renames)
      if (name.rfind(a, 0) == 0) {
        renamed = b + name.substr(a.size());
        break;
      }
    EXPECT_FALSE(renamed.empty()) << "no original name for " << name;
    out.emplace_back(renamed, w.tensor(name).clone());
  }
  save_safetensors(to + "/model.safetensors", out, {{"format", "pt"}});
}

void expect_same_parameters(MultimodalLM& a, MultimodalLM& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& p : pa) {
    ASSERT_TRUE(pb.contains(p.key())) << p.key();
    EXPECT_TRUE(at::equal(p.value(), pb[p.key()])) << p.key();
  }
}

double max_abs_on_valid(const at::Tensor& a, const at::Tensor& b, const at::Tensor& valid) {
  auto m = valid.unsqueeze(-1).expand_as(a);
  return (a - b).abs().masked_select(m).max().item<double>();
}

}  // namespace

TEST(LlavaNext, LogitsLossAndEveryGradientMatchTransformers) {
  const auto dir = test::fixture(kCase);
  auto model = load_pretrained(dir);
  ASSERT_TRUE(model->config.anyres.has_value());
  ASSERT_TRUE(model->image_newline.defined());
  SafetensorsFile ref(dir + "/reference.safetensors");
  std::ifstream mf(dir + "/reference.json");
  ASSERT_TRUE(mf.good()) << dir << "/reference.json";
  const auto meta = nlohmann::json::parse(mf);
  auto in = inputs_from(ref, model->config);
  auto out = model->forward(in);
  const double logit_err = max_abs_on_valid(out.logits, ref.tensor("logits"), in.attention_mask);
  std::printf("[ info ] llava_next_tiny: %lld tiles of %lld images, max |logit diff| %.3g, loss %.7f vs %.7f\n",
              static_cast<long long>(in.pixel_values.size(0)), static_cast<long long>(in.image_sizes.size(0)),
              logit_err, out.lm_loss.item<double>(), ref.tensor("loss").item<double>());
  EXPECT_LT(logit_err, 1e-5) << "max abs logit difference";
  EXPECT_NEAR(out.lm_loss.item<double>(), ref.tensor("loss").item<double>(), 1e-5);
  out.lm_loss.backward();
  auto params = model->named_parameters();
  std::map<std::string, bool> covered;
  for (const auto& p : params) covered[p.key()] = false;
  auto cover = [&](const std::string& hf) -> std::string {
    const auto g = hf_to_gmod(hf);
    if (!g || !params.contains(*g)) {
      ADD_FAILURE() << "transformers parameter " << hf << " has no gmod counterpart";
      return "";
    }
    EXPECT_FALSE(covered[*g]) << *g << " covered twice";
    covered[*g] = true;
    return *g;
  };
  int compared = 0;
  double worst = 0;
  std::string worst_name;
  for (const auto& name : ref.names()) {
    if (name.rfind("grad.", 0) != 0) continue;
    const auto g = cover(name.substr(5));
    if (g.empty()) continue;
    const auto mine = params[g].grad();
    if (!mine.defined()) {
      ADD_FAILURE() << g << " has no gradient in gmod but has one in transformers";
      continue;
    }
    const auto r = ref.tensor(name);
    const double diff = (mine - r).norm().item<double>(), rel = diff / std::max(r.norm().item<double>(), 1e-30);
    EXPECT_TRUE(rel < 1e-4 || diff < 1e-8) << "gradient of " << g << ": relative L2 difference " << rel;
    if (rel > worst && diff >= 1e-8) worst = rel, worst_name = g;
    ++compared;
  }
  std::printf("[ info ] %d gradients compared, worst relative difference %.3g (%s)\n", compared, worst,
              worst_name.c_str());
  for (const auto& hf : meta.at("no_grad")) {
    const auto g = cover(hf.get<std::string>());
    if (g.empty()) continue;
    const auto mine = params[g].grad();
    EXPECT_TRUE(!mine.defined() || mine.abs().max().item<double>() == 0.0) << g << " should get no gradient";
  }
  for (const auto& [g, seen] : covered) EXPECT_TRUE(seen) << "gmod parameter " << g << " has no reference";
  EXPECT_TRUE(covered["image_newline"]);
  EXPECT_EQ(compared, meta.at("gradients").get<int>());
}

TEST(LlavaNext, FixtureHoldsTheCasesItClaims) {
  const auto c = load_model_config(test::fixture(kCase));
  ASSERT_TRUE(c.anyres.has_value());
  EXPECT_FALSE(c.anyres->unpad_truncates);  // transformers' rounding
  SafetensorsFile ref(test::fixture(kCase) + "/reference.safetensors");
  const auto sizes = ref.tensor("input.image_sizes");
  bool tie = false, parted = false;
  for (int64_t i = 0; i < sizes.size(0); ++i) {
    const int h = sizes[i][0].item<int>(), w = sizes[i][1].item<int>(), tile = c.vision->image_size;
    const auto& p = c.anyres->pinpoints;
    // a tie: reversing the candidates changes the choice
    std::vector<std::array<int, 2>> rev(p.rbegin(), p.rend());
    tie |= select_best_resolution(h, w, p) != select_best_resolution(h, w, rev);
    const auto g = anyres_grid_shape(h, w, *c.anyres, tile);
    const int side = tile / c.vision->patch_size;
    const auto a = anyres_unpad_box(h, w, g[0] * side, g[1] * side, false);
    const auto b = anyres_unpad_box(h, w, g[0] * side, g[1] * side, true);
    parted |= a.r1 - a.r0 != b.r1 - b.r0 || a.c1 - a.c0 != b.c1 - b.c0;
  }
  EXPECT_TRUE(tie) << "an image whose pinpoint is decided by the order";
  EXPECT_TRUE(parted) << "an image where transformers' and the original's unpad rounding part";
  // a text-only row and left padding
  const auto ids = ref.tensor("input.input_ids");
  const auto mask = ref.tensor("input.attention_mask");
  EXPECT_EQ(mask.select(1, 0).min().item<int64_t>(), 0);
  EXPECT_TRUE(((ids == c.image_token_id).sum(1) == 0).any().item<bool>());
}

TEST(LlavaNext, OriginalLayoutLoadsToTheSameModel) {
  const auto dir = test::fixture(kCase);
  test::TempDir tmp;
  write_original_layout(dir, tmp.path.string());
  auto hf = load_pretrained(dir);
  auto orig = load_pretrained(tmp.path.string());
  ASSERT_TRUE(orig->config.anyres.has_value());
  EXPECT_EQ(orig->config.anyres->pinpoints, hf->config.anyres->pinpoints) << "(width, height) read as such";
  EXPECT_TRUE(orig->config.anyres->unpad_truncates) << "the original code truncates";
  EXPECT_TRUE(orig->config.original_layout());
  expect_same_parameters(*hf, *orig);
  // Image by image: the same features wherever the two roundings agree; for 47 x 188 (2.9999999999999996 rows)
  // the original keeps 2 of the 4 feature rows (rows 1 and 2), transformers all 4.
  SafetensorsFile ref(dir + "/reference.safetensors");
  const auto in = inputs_from(ref, hf->config);
  at::NoGradGuard ng;
  int64_t at_tile = 0;
  const int tile = hf->config.vision->image_size, side = tile / hf->config.vision->patch_size;
  for (int64_t i = 0; i < in.image_sizes.size(0); ++i) {
    const int h = in.image_sizes[i][0].item<int>(), w = in.image_sizes[i][1].item<int>();
    const int n = anyres_num_tiles(h, w, *hf->config.anyres, tile);
    const auto px = in.pixel_values.narrow(0, at_tile, n);
    const auto sizes = in.image_sizes.narrow(0, i, 1);
    at_tile += n;
    const auto a = hf->image_token_features(px, {}, sizes), b = orig->image_token_features(px, {}, sizes);
    if (h == 47 && w == 188) {
      const int64_t row = 3 * side + 1;  // a 1x3 grid: 12 columns + the newline
      ASSERT_EQ(a.size(0), side * side + 4 * row);
      ASSERT_EQ(b.size(0), side * side + 2 * row);
      EXPECT_TRUE(at::equal(b.narrow(0, 0, side * side), a.narrow(0, 0, side * side)));
      EXPECT_TRUE(at::equal(b.narrow(0, side * side, 2 * row), a.narrow(0, side * side + row, 2 * row)));
    } else {
      EXPECT_TRUE(at::equal(a, b)) << h << "x" << w;
    }
  }
}

TEST(LlavaNext, ExportsBothLayoutsAndLoadsThemBack) {
  const auto dir = test::fixture(kCase);
  test::TempDir orig_dir, hf_out, orig_out;
  write_original_layout(dir, orig_dir.path.string());
  auto hf = load_pretrained(dir);
  auto orig = load_pretrained(orig_dir.path.string());
  save_pretrained(*hf, hf_out.path.string());
  save_pretrained(*orig, orig_out.path.string());
  // GMOD_LLAVA_NEXT_EXPORT_DIR=DIR also writes both exports to DIR/{llava_next,llava_llama}, for loading them in
  // transformers by hand (tests/fixtures/make_llava_next_fixtures.py --check-export DIR).
  if (const char* keep = std::getenv("GMOD_LLAVA_NEXT_EXPORT_DIR")) {
    save_pretrained(*hf, std::string(keep) + "/llava_next");
    save_pretrained(*orig, std::string(keep) + "/llava_llama");
  }
  std::ifstream fh(hf_out.path / "config.json"), fo(orig_out.path / "config.json");
  const auto jh = nlohmann::json::parse(fh), jo = nlohmann::json::parse(fo);
  EXPECT_EQ(jh["model_type"], "llava_next");
  EXPECT_EQ(jh["image_grid_pinpoints"][0], (nlohmann::json{8, 16}));
  EXPECT_EQ(jo["model_type"], "llava_llama");
  EXPECT_EQ(jo["image_aspect_ratio"], "anyres");
  EXPECT_EQ(jo["mm_patch_merge_type"], "spatial_unpad");
  EXPECT_EQ(jo["image_grid_pinpoints"][0], (nlohmann::json{16, 8})) << "(width, height) in the original layout";
  SafetensorsFile so((orig_out.path / "model.safetensors").string());
  EXPECT_TRUE(so.has("model.image_newline"));
  EXPECT_TRUE(so.has("model.mm_projector.0.weight"));
  auto hf2 = load_pretrained(hf_out.path.string());
  auto orig2 = load_pretrained(orig_out.path.string());
  EXPECT_FALSE(hf2->config.anyres->unpad_truncates);
  EXPECT_TRUE(orig2->config.anyres->unpad_truncates);
  EXPECT_EQ(orig2->config.anyres->pinpoints, hf->config.anyres->pinpoints);
  expect_same_parameters(*hf, *hf2);
  expect_same_parameters(*hf, *orig2);
}

TEST(LlavaNext, ConfigProblemsAreNamed) {
  const auto dir = test::fixture(kCase);
  std::ifstream f(dir + "/config.json");
  const auto base = nlohmann::json::parse(f);
  auto expect_error = [&](nlohmann::json j, const std::string& fragment) {
    try {
      parse_model_config(j, "llava_next/config.json");
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  auto j = base;
  j["vision_feature_select_strategy"] = "full";
  expect_error(j, "needs vision_feature_select_strategy 'default'");
  j = base;
  j["image_grid_pinpoints"] = {{8, 12}};
  expect_error(j, "is not a positive multiple of the tower's image_size 8");
  j = base;
  j["image_grid_pinpoints"] = "not pairs";
  expect_error(j, "image_grid_pinpoints' must be a list of [height, width] pairs");
  j = base;
  j.erase("image_grid_pinpoints");  // transformers' default: LLaVA-v1.6's list, not multiples of 8 px tiles
  EXPECT_NO_THROW({
    nlohmann::json k = j;
    k["vision_config"]["image_size"] = 336;
    k["vision_config"]["patch_size"] = 14;
    k["text_config"]["max_position_embeddings"] = 4096;
    const auto c = parse_model_config(k, "default pinpoints");
    EXPECT_EQ(c.anyres->pinpoints.size(), 5u);
    EXPECT_EQ(c.anyres->pinpoints[3], (std::array<int, 2>{1008, 336}));
  });
  // The original layout: OneVision's anyres_max_9 and a flat merge are refused, not silently run as LLaVA-1.5.
  nlohmann::json o = base["text_config"];
  o["model_type"] = "llava_llama";
  o["vision_config"] = base["vision_config"];
  o["mm_hidden_size"] = 32;
  o["mm_projector_type"] = "mlp2x_gelu";
  o["image_grid_pinpoints"] = {{16, 8}};
  o["image_aspect_ratio"] = "anyres_max_9";
  o["mm_patch_merge_type"] = "spatial_unpad";
  expect_error(o, "image_aspect_ratio 'anyres_max_9' is not supported");
  o["image_aspect_ratio"] = "anyres";
  o["mm_patch_merge_type"] = "flat";
  expect_error(o, "mm_patch_merge_type 'flat' is not supported with AnyRes");
  o["mm_patch_merge_type"] = "spatial_unpad";
  o.erase("image_grid_pinpoints");
  expect_error(o, "missing field 'image_grid_pinpoints'");
}

TEST(LlavaNext, MissingSizesAndTileCountsThatDoNotAddUpAreNamed) {
  const auto dir = test::fixture(kCase);
  auto model = load_pretrained(dir);
  SafetensorsFile ref(dir + "/reference.safetensors");
  auto in = inputs_from(ref, model->config);
  at::NoGradGuard ng;
  auto expect_error = [&](const ModelInputs& bad, const std::string& fragment) {
    try {
      model->forward(bad);
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  auto bad = in;
  bad.image_sizes = at::Tensor();
  expect_error(bad, "needs image_sizes");
  bad = in;
  bad.pixel_values = in.pixel_values.narrow(0, 0, in.pixel_values.size(0) - 1);  // the last image loses a tile
  expect_error(bad, "AnyRes image 4 (18x30) needs tiles 16..20 but the batch has 20 tiles");
  bad = in;
  bad.pixel_values = at::cat({in.pixel_values, in.pixel_values.narrow(0, 0, 1)});  // one tile too many
  expect_error(bad, "AnyRes batch has 22 tiles but its 5 image_sizes account for 21");
}

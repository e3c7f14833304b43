// LLaVA-OneVision (AnyRes with anyres_max_N, the multi-image rule) against transformers'
// LlavaOnevisionForConditionalGeneration on a committed fixture (tests/fixtures/make_llava_onevision_fixtures.py ->
// tests/fixtures/hf/llava_onevision_tiny): committed images through LlavaOnevisionImageProcessorPil, a batch with
// two images downscaled (one where floor and rounding part), one under the threshold, a sample with two images
// (base tiles only), a text-only row, a video (frames pooled 2x2, one newline), right and left padding. Tolerances
// as test_llava_next.cpp: logits 1e-5 max abs on real tokens, loss 1e-5, every gradient 1e-4 relative
// (image_newline's included); token counts exact.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "model/anyres_grid.h"
#include "model/hf_names.h"
#include "model/llava_next.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "tests/common/paths.h"

using namespace gmod;

namespace test_llava_onevision {

const char* kCase = "hf/llava_onevision_tiny";

nlohmann::json reference_json(const std::string& dir) {
  std::ifstream f(dir + "/reference.json");
  EXPECT_TRUE(f.good()) << dir << "/reference.json";
  return nlohmann::json::parse(f);
}

// image_sizes as gmod carries them: each image of a sample with several negated (anyres_base_only), from the
// processor's batch_num_images.
at::Tensor marked_sizes(const SafetensorsFile& ref) {
  auto sizes = ref.tensor("input.image_sizes").to(at::kLong).clone();
  const auto per_sample = ref.tensor("input.batch_num_images").to(at::kLong);
  int64_t at = 0;
  for (int64_t s = 0; s < per_sample.size(0); ++s) {
    const int64_t n = per_sample[s].item<int64_t>();
    if (n > 1) sizes.narrow(0, at, n).neg_();
    at += n;
  }
  return sizes;
}

ModelInputs inputs_from(const SafetensorsFile& ref) {
  ModelInputs in;
  in.input_ids = ref.tensor("input.input_ids").clone();
  in.attention_mask = ref.tensor("input.attention_mask").to(at::kBool);
  in.labels = ref.tensor("input.labels").clone();
  in.image_sizes = marked_sizes(ref);
  in.pixel_values = ref.tensor("input.pixel_values").to(at::kFloat);  // [tiles, 3, S, S], image by image
  // transformers' [videos, frames, 3, S, S] as gmod carries videos: every frame [frames, 3, S, S] and per video
  // (frames, side, side)
  const auto v = ref.tensor("input.pixel_values_videos").to(at::kFloat);
  in.pixel_values_videos = v.flatten(0, 1);
  const int64_t side = v.size(-1) / 4;  // the fixture's 4-px patches
  in.video_grid_thw = at::tensor({v.size(1), side, side}, at::kLong).view({1, 3}).expand({v.size(0), 3}).contiguous();
  return in;
}

double max_abs_on_valid(const at::Tensor& a, const at::Tensor& b, const at::Tensor& valid) {
  auto m = valid.unsqueeze(-1).expand_as(a);
  return (a - b).abs().masked_select(m).max().item<double>();
}

TEST(LlavaOnevision, LogitsLossAndEveryGradientMatchTransformers) {
  const auto dir = test::fixture(kCase);
  auto model = load_pretrained(dir);
  ASSERT_TRUE(model->config.anyres.has_value());
  EXPECT_EQ(model->config.anyres->max_patches, 2);
  ASSERT_TRUE(model->image_newline.defined());
  SafetensorsFile ref(dir + "/reference.safetensors");
  const auto meta = reference_json(dir);
  auto in = inputs_from(ref);
  auto out = model->forward(in);
  const double logit_err = max_abs_on_valid(out.logits, ref.tensor("logits"), in.attention_mask);
  std::printf("[ info ] llava_onevision_tiny: %lld tiles of %lld images, max |logit diff| %.3g, loss %.7f vs %.7f\n",
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

// gmod's counts from the sizes alone (what the data path gives the template) against LlavaOnevisionProcessor's
// image tokens per row and the model's packed features per image; tiles against the processor's.
TEST(LlavaOnevision, TokenAndTileCountsMatchTheProcessor) {
  const auto dir = test::fixture(kCase);
  const auto c = load_model_config(dir);
  SafetensorsFile ref(dir + "/reference.safetensors");
  const auto meta = reference_json(dir);
  const auto sizes = marked_sizes(ref);
  const int tile = c.vision->image_size, side = tile / c.vision->patch_size;
  const auto& rows = meta.at("images");
  int64_t image = 0, tiles = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    int64_t row_tokens = 0;
    for (size_t k = 0; k < rows[r].size(); ++k, ++image) {
      const int h = static_cast<int>(sizes[image][0].item<int64_t>());
      const int w = static_cast<int>(sizes[image][1].item<int64_t>());
      const int n = anyres_image_tokens(h, w, *c.anyres, tile, side);
      EXPECT_EQ(n, meta.at("image_tokens")[image].get<int>()) << rows[r][k] << " in row " << r;
      EXPECT_EQ(anyres_num_tiles(h, w, *c.anyres, tile), meta.at("tiles")[image].get<int>()) << rows[r][k];
      row_tokens += n;
      tiles += anyres_num_tiles(h, w, *c.anyres, tile);
    }
    EXPECT_EQ(row_tokens, meta.at("processor_image_tokens_per_row")[r].get<int64_t>()) << "row " << r;
  }
  EXPECT_EQ(image, sizes.size(0));
  EXPECT_EQ(tiles, ref.tensor("input.pixel_values").size(0));
  // The video: frames * ceil(side / 2)^2 + 1, LlavaOnevisionProcessor's count and the ids' run.
  const int64_t frames = meta.at("video_frames").get<int64_t>();
  EXPECT_EQ(onevision_video_tokens(frames, side), meta.at("processor_video_tokens").get<int64_t>());
  const auto ids = ref.tensor("input.input_ids");
  EXPECT_EQ((ids == c.anyres->video_token_id).sum().item<int64_t>(), onevision_video_tokens(frames, side));
}

TEST(LlavaOnevision, VideoFramesThatDoNotAddUpAreNamed) {
  const auto dir = test::fixture(kCase);
  auto model = load_pretrained(dir);
  SafetensorsFile ref(dir + "/reference.safetensors");
  auto in = inputs_from(ref);
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
  bad.pixel_values_videos = in.pixel_values_videos.narrow(0, 0, 2);  // a frame lost
  expect_error(bad, "LLaVA-OneVision video 0: video_grid_thw row (3, 4, 4) does not fit the batch's 2 frames");
  bad = in;
  bad.video_grid_thw = at::tensor({2, 4, 4}, at::kLong).view({1, 3});  // one frame fewer than given
  expect_error(bad, "LLaVA-OneVision videos: 3 frames but video_grid_thw accounts for 2");
  bad = in;
  bad.input_ids = in.input_ids.masked_fill(in.input_ids == model->config.anyres->video_token_id, 5);
  expect_error(bad, "batch has 0 video-token positions (id 62) but 3 video frames give 13 video tokens");
}

TEST(LlavaOnevision, FixtureHoldsTheCasesItClaims) {
  const auto dir = test::fixture(kCase);
  const auto c = load_model_config(dir);
  SafetensorsFile ref(dir + "/reference.safetensors");
  const auto sizes = marked_sizes(ref);
  const int tile = c.vision->image_size, side = tile / c.vision->patch_size;
  int downscaled = 0, kept = 0, floor_not_round = 0, base_only = 0;
  for (int64_t i = 0; i < sizes.size(0); ++i) {
    const int h = static_cast<int>(sizes[i][0].item<int64_t>()), w = static_cast<int>(sizes[i][1].item<int64_t>());
    if (anyres_base_only(h, w)) {
      ++base_only;
      continue;
    }
    const auto g = anyres_grid_shape(h, w, *c.anyres, tile);
    const auto b = anyres_unpad_box(h, w, g[0] * side, g[1] * side, false);
    const int rows = b.r1 - b.r0, cols = b.c1 - b.c0;
    const auto m = anyres_max_grid(rows, cols, side, c.anyres->max_patches);
    if (m[0] == rows && m[1] == cols) {
      ++kept;
      continue;
    }
    ++downscaled;
    const double ratio = std::sqrt(double(rows) * cols / (c.anyres->max_patches * side * side));
    floor_not_round += std::lround(rows / ratio) != m[0] || std::lround(cols / ratio) != m[1];
  }
  EXPECT_GE(downscaled, 2);
  EXPECT_GE(kept, 1) << "an image under anyres_max_N's threshold";
  EXPECT_GE(floor_not_round, 1) << "a downscale where rounding would give another size than floor";
  EXPECT_EQ(base_only, 2) << "a sample with two images";
  const auto ids = ref.tensor("input.input_ids");
  EXPECT_EQ(ref.tensor("input.attention_mask").select(1, 0).min().item<int64_t>(), 0) << "left padding";
  EXPECT_TRUE(((ids == c.image_token_id).sum(1) == 0).any().item<bool>()) << "a text-only row";
}

// anyres_max_N's downscale as transformers computes it: int(h // ratio) with Python's float floor division.
TEST(LlavaOnevision, AnyresMaxGridFollowsTransformersFormula) {
  EXPECT_EQ(anyres_max_grid(8, 12, 4, 2), (std::array<int, 2>{4, 6}));   // ratio 1.732
  EXPECT_EQ(anyres_max_grid(8, 6, 4, 2), (std::array<int, 2>{6, 4}));    // ratio 1.2247: 4.899 -> 4
  EXPECT_EQ(anyres_max_grid(4, 6, 4, 2), (std::array<int, 2>{4, 6}));    // ratio 0.87: kept
  EXPECT_EQ(anyres_max_grid(6, 6, 4, 2), (std::array<int, 2>{6, 6}));    // ratio 1.0607 <= 1.1: kept
  EXPECT_EQ(anyres_max_grid(7, 7, 4, 2), (std::array<int, 2>{5, 5}));    // ratio 1.2374
  EXPECT_EQ(anyres_max_grid(8, 12, 4, 0), (std::array<int, 2>{8, 12}));  // LLaVA-NeXT: no rule
  // llava-onevision-qwen2-7b-ov: a 2x2 grid of 384-px tiles (54x54 patches of 27 a tile), anyres_max_9
  EXPECT_EQ(anyres_max_grid(54, 54, 27, 9), (std::array<int, 2>{54, 54}));
  EXPECT_EQ(anyres_max_grid(162, 162, 27, 9), (std::array<int, 2>{81, 81}));  // 6x6 tiles: ratio 2
  EXPECT_EQ(anyres_max_grid(108, 162, 27, 9), (std::array<int, 2>{66, 99}));  // ratio 1.633: 66.1, 99.2
  EXPECT_EQ(anyres_max_grid(81, 162, 27, 9), (std::array<int, 2>{57, 114}));  // ratio sqrt 2: 57.3, 114.6
}

// The planner's bound (anyres_max_image_tokens): no image of 1 to 300 pixels a side takes more under the fixture's
// config; with anyres_max_9's 36 pinpoints of 27^2-patch tiles it is far under the whole 6x6 grid.
TEST(LlavaOnevision, MaxImageTokensBoundsEveryImage) {
  const auto c = load_model_config(test::fixture(kCase));
  const int64_t bound = anyres_max_image_tokens(*c.anyres, 16, 4);
  int64_t most = 0;
  for (int h = 1; h <= 300; ++h)
    for (int w = 1; w <= 300; ++w) most = std::max<int64_t>(most, anyres_image_tokens(h, w, *c.anyres, 16, 4));
  std::printf("[ info ] fixture config: at most %lld positions for images of 1 to 300 px a side, bound %lld\n",
              static_cast<long long>(most), static_cast<long long>(bound));
  EXPECT_LE(most, bound);
  AnyresConfig ov;
  for (int h = 1; h <= 6; ++h)
    for (int w = 1; w <= 6; ++w) ov.pinpoints.push_back({384 * h, 384 * w});
  ov.max_patches = 9;
  const int64_t real = anyres_max_image_tokens(ov, 384, 27);
  std::printf("[ info ] anyres_max_9, 36 pinpoints: at most %lld positions an image (the whole 6x6 grid: %d)\n",
              static_cast<long long>(real), 729 + 162 * 163);
  EXPECT_LT(real, 729 + 162 * 163);
  EXPECT_GE(real, 729 + 81 * 82);  // a 6x6 grid downscaled
}

TEST(LlavaOnevision, ConfigReadsAnyresMaxAndNamesWhatItRefuses) {
  const auto dir = test::fixture(kCase);
  std::ifstream f(dir + "/config.json");
  const auto base = nlohmann::json::parse(f);
  auto expect_error = [&](nlohmann::json j, const std::string& fragment) {
    try {
      parse_model_config(j, "llava_onevision/config.json");
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  for (const char* bad : {"anyres", "anyres_max_0", "anyres_max_x", "pad"}) {
    auto j = base;
    j["vision_aspect_ratio"] = bad;
    expect_error(j, std::string("vision_aspect_ratio '") + bad + "' is not supported");
  }
  auto j = base;
  j["vision_feature_select_strategy"] = "default";  // SigLIP without its first patch: no grid
  expect_error(j, "SigLIP tower needs vision_feature_select_strategy 'full'");
  j = base;
  j.erase("vision_aspect_ratio");  // LlavaOnevisionConfig's default
  EXPECT_EQ(parse_model_config(j, "default aspect").anyres->max_patches, 9);
  j.erase("image_grid_pinpoints");  // its default list: 384-px tiles, 1 to 6 each way (multiples of 16 too)
  const auto c = parse_model_config(j, "default pinpoints");
  ASSERT_EQ(c.anyres->pinpoints.size(), 36u);
  EXPECT_EQ(c.anyres->pinpoints[1], (std::array<int, 2>{384, 768}));
  EXPECT_EQ(c.anyres->pinpoints[35], (std::array<int, 2>{2304, 2304}));
}

TEST(LlavaOnevision, ExportsTransformersLayoutAndLoadsItBack) {
  const auto dir = test::fixture(kCase);
  test::TempDir out;
  auto model = load_pretrained(dir);
  save_pretrained(*model, out.path.string());
  // GMOD_LLAVA_ONEVISION_EXPORT_DIR=DIR also writes the export there, for loading it in transformers by hand
  // (tests/fixtures/make_llava_onevision_fixtures.py --check-export DIR).
  if (const char* keep = std::getenv("GMOD_LLAVA_ONEVISION_EXPORT_DIR")) save_pretrained(*model, keep);
  std::ifstream f(out.path / "config.json");
  const auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["model_type"], "llava_onevision");
  EXPECT_EQ(j["architectures"][0], "LlavaOnevisionForConditionalGeneration");
  EXPECT_EQ(j["vision_aspect_ratio"], "anyres_max_2");
  EXPECT_EQ(j["vision_feature_select_strategy"], "full");
  EXPECT_EQ(j["image_grid_pinpoints"][5], (nlohmann::json{32, 48}));
  auto back = load_pretrained(out.path.string());
  EXPECT_EQ(back->config.anyres->max_patches, 2);
  EXPECT_EQ(back->config.anyres->pinpoints, model->config.anyres->pinpoints);
  auto pa = model->named_parameters(), pb = back->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (const auto& p : pa) {
    ASSERT_TRUE(pb.contains(p.key())) << p.key();
    EXPECT_TRUE(at::equal(p.value(), pb[p.key()])) << p.key();
  }
}

}  // namespace test_llava_onevision

// AnyRes preprocessing (data/anyres.h) and geometry (model/anyres_grid.h) against transformers'
// LlavaNextImageProcessorPil and LlavaNextProcessor on committed images (tests/fixtures/make_anyres_fixtures.py
// -> tests/fixtures/anyres/): the same tiles in the same order within the CLIP preprocessing tests' tolerance
// (test_image.cpp: bit-exact resize, so float rounding only), the same image_sizes row and image-token count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/anyres.h"
#include "data/image.h"

namespace fs = std::filesystem;
using gmod::Image;

namespace {

fs::path fixtures() {
  if (const char* root = std::getenv("GMOD_SOURCE_DIR")) return fs::path(root) / "tests/fixtures";
  return fs::path(__FILE__).parent_path().parent_path() / "fixtures";
}

std::vector<char> read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open fixture " << p;
  return std::vector<char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  EXPECT_TRUE(f.good()) << "missing " << p << " (run tests/fixtures/make_anyres_fixtures.py)";
  nlohmann::json j;
  f >> j;
  return j;
}

gmod::AnyresConfig anyres_of(const nlohmann::json& c) {
  gmod::AnyresConfig a;
  for (const auto& p : c["pinpoints"]) a.pinpoints.push_back({p[0].get<int>(), p[1].get<int>()});
  return a;
}

// PIL's decoded pixels where test_image.cpp's fixtures hold them (isolates the preprocessing); gmod's decoder for
// the PNG written by the AnyRes generator (lossless: the same pixels).
Image input_image(const std::string& rel) {
  const auto images = read_json(fixtures() / "image/manifest.json");
  for (const auto& e : images["images"])
    if ("image/" + e["file"].get<std::string>() == rel) {
      Image im;
      im.width = e["width"];
      im.height = e["height"];
      const auto b = read_bytes(fixtures() / "image" / e["rgb"].get<std::string>());
      im.rgb.assign(b.begin(), b.end());
      EXPECT_EQ(im.rgb.size(), size_t(im.width) * im.height * 3) << rel;
      return im;
    }
  return gmod::decode_image_file((fixtures() / rel).string());
}

}  // namespace

TEST(Anyres, TilesImageSizesAndTokenCountsMatchTransformers) {
  const auto m = read_json(fixtures() / "anyres/manifest.json");
  ASSERT_GE(m["cases"].size(), 10u);
  gmod::ClipPreprocessConfig cfg;
  for (int i = 0; i < 3; ++i) cfg.mean[i] = m["mean"][i], cfg.std[i] = m["std"][i];
  double worst = 0, sum = 0;
  size_t n = 0;
  int other_order = 0;
  for (const auto& c : m["cases"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const int tile = c["tile"], side = tile / c["patch"].get<int>();
    cfg.size = cfg.crop = tile;
    const auto anyres = anyres_of(c);
    const Image img = input_image(c["image"]);
    const auto got = gmod::anyres_preprocess(img, cfg, anyres);
    EXPECT_EQ(got.image_size[0], c["image_size"][0].get<int>());
    EXPECT_EQ(got.image_size[1], c["image_size"][1].get<int>());
    ASSERT_EQ(got.tiles, c["tiles"].get<int>());
    EXPECT_EQ(gmod::anyres_num_tiles(img.height, img.width, anyres, tile), got.tiles);
    EXPECT_EQ(gmod::anyres_image_tokens(img.height, img.width, anyres, tile, side), c["image_tokens"].get<int>());
    const size_t count = size_t(got.tiles) * 3 * tile * tile;
    const auto bytes = read_bytes(fixtures() / "anyres" / c["pixels"].get<std::string>());
    ASSERT_EQ(bytes.size(), count * sizeof(float));
    ASSERT_EQ(got.pixels.size(), count);
    std::vector<float> want(count);
    std::memcpy(want.data(), bytes.data(), bytes.size());
    double case_max = 0, case_sum = 0;
    for (size_t k = 0; k < count; ++k) {
      const double d = std::fabs(double(got.pixels[k]) - want[k]);
      case_max = std::max(case_max, d);
      case_sum += d;
    }
    std::printf("[ info ] %-16s %2dx%-3d grid %dx%d, %d tiles, %3d tokens: max |diff| %.3g\n", name.c_str(),
                img.height, img.width, got.grid[0], got.grid[1], got.tiles, c["image_tokens"].get<int>(), case_max);
    // Where Pillow ran its resizes horizontal pass first (gmod's order, as Pillow's ImagingResample) the resize is
    // bit-exact (test_image.cpp), so only float rounding may remain. The venv's Pillow runs some two-axis
    // reductions vertical pass first (the generator records which), and rounding between the passes then moves
    // a few pixels: those cases keep the CLIP tests' mean tolerance only.
    if (c["pillow_horizontal_first"].get<bool>()) EXPECT_LE(case_max, 1e-5);
    else ++other_order;
    EXPECT_LE(case_sum / count, 1e-2);
    worst = std::max(worst, case_max);
    sum += case_sum;
    n += count;
  }
  std::printf("[ info ] AnyRes vs LlavaNextImageProcessorPil over %zu values: mean |diff| %.3g, max %.3g (%d case(s) "
              "where Pillow resized vertical pass first)\n", n, sum / n, worst, other_order);
  EXPECT_LE(other_order, 2) << "most cases must be bit-exact";
}

TEST(Anyres, TiesKeepTheFirstListedPinpoint) {
  // A square image fits a 1x2 and a 2x1 grid equally well: the earlier candidate wins (transformers and LLaVA).
  const std::vector<std::array<int, 2>> a = {{16, 32}, {32, 16}}, b = {{32, 16}, {16, 32}};
  EXPECT_EQ(gmod::select_best_resolution(26, 26, a), (std::array<int, 2>{16, 32}));
  EXPECT_EQ(gmod::select_best_resolution(26, 26, b), (std::array<int, 2>{32, 16}));
  // More of the image kept beats less waste; equal kept area, less waste wins.
  EXPECT_EQ(gmod::select_best_resolution(60, 100, {{16, 32}, {32, 32}}), (std::array<int, 2>{32, 32}));
  EXPECT_EQ(gmod::select_best_resolution(9, 12, {{48, 48}, {16, 32}}), (std::array<int, 2>{16, 32}));
  EXPECT_THROW(gmod::select_best_resolution(9, 12, {}), std::invalid_argument);
  EXPECT_THROW(gmod::select_best_resolution(0, 12, a), std::invalid_argument);
}

TEST(Anyres, UnpadMatchesTransformersAndTheOriginalRounding) {
  // transformers' unpad_image rounds the image's extent in the feature map to 7 decimals before truncating, the
  // original LLaVA code's truncates: they part where the extent lies a hair below an integer (47 x 188 in a 4 x 12
  // map: 2.9999999999999996 rows). Both are the references' own results (the generator runs both functions).
  const auto m = read_json(fixtures() / "anyres/manifest.json");
  ASSERT_GE(m["unpad"].size(), 5u);
  int parted = 0;
  for (const auto& c : m["unpad"]) {
    const int h = c["image_size"][0], w = c["image_size"][1], rows = c["map"][0], cols = c["map"][1];
    SCOPED_TRACE(std::to_string(h) + "x" + std::to_string(w) + " in " + std::to_string(rows) + "x" +
                 std::to_string(cols));
    const auto t = gmod::anyres_unpad_box(h, w, rows, cols, /*truncate=*/false);
    EXPECT_EQ(t.r1 - t.r0, c["transformers"][0].get<int>());
    EXPECT_EQ(t.c1 - t.c0, c["transformers"][1].get<int>());
    EXPECT_EQ(t.r0 + t.r1, rows) << "centred";
    EXPECT_EQ(t.c0 + t.c1, cols) << "centred";
    if (!c.contains("original")) continue;  // generated without --llava-repo
    const auto o = gmod::anyres_unpad_box(h, w, rows, cols, /*truncate=*/true);
    EXPECT_EQ(o.r1 - o.r0, c["original"][0].get<int>());
    EXPECT_EQ(o.c1 - o.c0, c["original"][1].get<int>());
    parted += c["original"] != c["transformers"];
  }
  EXPECT_GE(parted, 3) << "the fixture should hold sizes where the two roundings part";
}

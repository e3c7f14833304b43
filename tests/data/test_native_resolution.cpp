// Qwen2-VL native-resolution preprocessing against transformers' Qwen2VLImageProcessor (torchvision backend)
// (tests/fixtures/make_native_resolution_fixtures.py -> tests/fixtures/native_resolution/).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/image.h"
#include "data/native_resolution.h"
#include "tests/common/paths.h"

using gmod::Image;
using gmod::test::fixture;

namespace {

// Tolerances. The processor resizes uint8 images with ATen's uint8 antialiased bicubic kernel: int16 fixed-point
// weights and integer sums (its AVX2 and generic loops agree bit for bit), which resize_bicubic_aa reproduces, so the
// resized pixels must be equal, on any CPU. The normalisation is one float32 subtraction and division per value, as in
// torch: kFloatTol only absorbs a compiler contracting it differently (measured: 0 on this machine, every value).
constexpr float kFloatTol = 1e-6f;

std::vector<char> read_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open fixture " << p;
  return std::vector<char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

template <typename T>
std::vector<T> read_raw(const std::string& p, size_t count) {
  const auto bytes = read_bytes(p);
  EXPECT_EQ(bytes.size(), count * sizeof(T)) << p;
  std::vector<T> out(count);
  std::memcpy(out.data(), bytes.data(), std::min(bytes.size(), count * sizeof(T)));
  return out;
}

nlohmann::json manifest() {
  std::ifstream f(fixture("native_resolution/manifest.json"));
  EXPECT_TRUE(f.good()) << "missing manifest (run tests/fixtures/make_native_resolution_fixtures.py)";
  nlohmann::json j;
  f >> j;
  return j;
}

gmod::NativeResolutionConfig config() { return gmod::load_native_resolution_config(fixture("native_resolution")); }

Image input(const nlohmann::json& e) {
  return gmod::decode_image_file(fixture("image/" + e["file"].get<std::string>()));
}

}  // namespace

TEST(NativeResolution, ConfigReadsQwenKeys) {
  const auto cfg = config();
  EXPECT_EQ(cfg.patch_size, 4);
  EXPECT_EQ(cfg.merge_size, 2);
  EXPECT_EQ(cfg.temporal_patch_size, 2);
  EXPECT_EQ(cfg.min_pixels, 256);
  EXPECT_EQ(cfg.max_pixels, 1024);
  EXPECT_FLOAT_EQ(cfg.std[2], 0.27577711f);
}

TEST(NativeResolution, ConfigErrorsNameTheFile) {
  gmod::test::TempDir tmp;
  const auto write = [&](const std::string& text) {
    std::ofstream(tmp.str("preprocessor_config.json")) << text;
    return tmp.str();
  };
  const auto expect_error = [&](const std::string& text, const std::string& what) {
    try {
      gmod::load_native_resolution_config(write(text));
      ADD_FAILURE() << "no error for " << text;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("preprocessor_config.json"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error("{\"patch_size\": 0}", "patch_size");
  expect_error("{\"min_pixels\": 2048, \"max_pixels\": 1024}", "exceeds max_pixels");
  expect_error("{\"resample\": 2}", "resample");
  expect_error("{\"do_normalize\": false}", "do_normalize");
  expect_error("{\"image_std\": [1, 0, 1]}", "image_std");
  expect_error("not json", "invalid JSON");
  // size.{shortest,longest}_edge is the transformers-5 spelling; min_pixels / max_pixels win over it.
  auto cfg = gmod::load_native_resolution_config(write("{\"size\": {\"shortest_edge\": 100, \"longest_edge\": 900}}"));
  EXPECT_EQ(cfg.min_pixels, 100);
  EXPECT_EQ(cfg.max_pixels, 900);
  cfg = gmod::load_native_resolution_config(
      write("{\"size\": {\"shortest_edge\": 100, \"longest_edge\": 900}, \"max_pixels\": 800}"));
  EXPECT_EQ(cfg.max_pixels, 800);
}

TEST(NativeResolution, SmartResizeMatchesTransformers) {
  const auto cfg = config();
  const auto m = manifest();
  ASSERT_EQ(m["images"].size(), 5u);
  for (const auto& e : m["images"]) {
    const auto hw = gmod::smart_resize(e["height"], e["width"], cfg.factor(), cfg.min_pixels, cfg.max_pixels);
    EXPECT_EQ(hw[0], e["resized_height"].get<int>()) << e["file"];
    EXPECT_EQ(hw[1], e["resized_width"].get<int>()) << e["file"];
  }
  // Qwen2.5-VL's and Qwen2-VL's real settings (factor 28), from tiny to 8K and both aspect-ratio extremes.
  ASSERT_EQ(m["smart_resize"].size(), 34u);
  for (const auto& e : m["smart_resize"]) {
    const auto hw = gmod::smart_resize(e["height"], e["width"], e["factor"], e["min_pixels"], e["max_pixels"]);
    EXPECT_EQ(hw[0], e["resized"][0].get<int>()) << e.dump();
    EXPECT_EQ(hw[1], e["resized"][1].get<int>()) << e.dump();
  }
  EXPECT_THROW(gmod::smart_resize(1, 201, 8, 256, 1024), std::invalid_argument);
  EXPECT_THROW(gmod::smart_resize(0, 10, 8, 256, 1024), std::invalid_argument);
  EXPECT_NO_THROW(gmod::smart_resize(1, 200, 8, 256, 1024));
}

TEST(NativeResolution, ResizeMatchesTorchvision) {
  const auto m = manifest();
  ASSERT_EQ(m["images"].size(), 5u);
  for (const auto& e : m["images"]) {
    const Image img = input(e);
    const int h = e["resized_height"], w = e["resized_width"];
    const Image rs = gmod::resize_bicubic_aa(img, w, h);
    const auto ref = read_raw<uint8_t>(fixture("native_resolution/" + e["resized"].get<std::string>()),
                                       size_t(h) * w * 3);
    ASSERT_EQ(rs.rgb.size(), ref.size());
    int off = 0, worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const int d = std::abs(int(rs.rgb[i]) - int(ref[i]));
      off += d != 0;
      worst = std::max(worst, d);
    }
    std::printf("%s: resize %d of %zu uint8 values differ from torchvision, worst %d\n",
                e["file"].get<std::string>().c_str(), off, ref.size(), worst);
    EXPECT_EQ(off, 0) << e["file"] << ": worst difference " << worst;
  }
}

TEST(NativeResolution, PatchesMatchTransformers) {
  const auto cfg = config();
  const auto m = manifest();
  ASSERT_EQ(m["images"].size(), 5u);
  for (const auto& e : m["images"]) {
    const auto p = gmod::preprocess_native_image(input(e), cfg);
    const auto& g = e["grid_thw"];
    EXPECT_EQ(p.grid_thw[0], g[0].get<int64_t>()) << e["file"];
    EXPECT_EQ(p.grid_thw[1], g[1].get<int64_t>()) << e["file"];
    EXPECT_EQ(p.grid_thw[2], g[2].get<int64_t>()) << e["file"];
    ASSERT_EQ(p.rows(), e["rows"].get<int64_t>()) << e["file"];
    ASSERT_EQ(p.row_size, e["row_size"].get<int64_t>()) << e["file"];
    const auto ref = read_raw<float>(fixture("native_resolution/" + e["patches"].get<std::string>()),
                                     size_t(p.rows() * p.row_size));
    ASSERT_EQ(p.pixel_values.size(), ref.size());
    size_t off = 0;
    float worst = 0.0f;
    for (size_t i = 0; i < ref.size(); ++i) {
      const float d = std::abs(p.pixel_values[i] - ref[i]);
      off += d > kFloatTol;
      worst = std::max(worst, d);
    }
    std::printf("%s: %zu of %zu patch values off by more than %g, worst %g\n", e["file"].get<std::string>().c_str(),
                off, ref.size(), double(kFloatTol), double(worst));
    EXPECT_EQ(off, 0u) << e["file"] << ": worst difference " << worst;
  }
}

// The settings Qwen2.5-VL checkpoints ship (patch 14, merge 2, min_pixels 3136, max_pixels 12845056), from a
// preprocessor_config.json of that form: tiny.png (12x9) is upscaled to 56x84, 24 rows of 3 * 2 * 14 * 14.
TEST(NativeResolution, RealQwen25VlSettingsMatchTransformers) {
  const auto e = manifest()["qwen2_5_vl"];
  const auto cfg = gmod::load_native_resolution_config(fixture("native_resolution/" + e["config"].get<std::string>()));
  EXPECT_EQ(cfg.patch_size, 14);
  EXPECT_EQ(cfg.max_pixels, 12845056);
  const auto p = gmod::preprocess_native_image(input(e), cfg);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(p.grid_thw[k], e["grid_thw"][k].get<int64_t>());
  ASSERT_EQ(p.rows(), e["rows"].get<int64_t>());
  ASSERT_EQ(p.row_size, e["row_size"].get<int64_t>());
  const auto ref = read_raw<float>(fixture("native_resolution/" + e["patches"].get<std::string>()),
                                   size_t(p.rows() * p.row_size));
  size_t off = 0;
  for (size_t i = 0; i < ref.size(); ++i) off += std::abs(p.pixel_values[i] - ref[i]) > kFloatTol;
  EXPECT_EQ(off, 0u);
}

TEST(NativeResolution, PatchifyRejectsBadFrames) {
  const auto cfg = config();
  Image a;
  a.width = 16;
  a.height = 8;
  a.rgb.assign(16 * 8 * 3, 7);
  Image odd = a;
  odd.width = 12;
  odd.rgb.resize(12 * 8 * 3);
  EXPECT_THROW(gmod::patchify_frames({}, cfg), std::invalid_argument);
  EXPECT_THROW(gmod::patchify_frames({odd}, cfg), std::invalid_argument);
  Image b = a;
  b.height = 16;
  b.rgb.resize(16 * 16 * 3);
  EXPECT_THROW(gmod::patchify_frames({a, b}, cfg), std::invalid_argument);
  // Three frames with T = 2: the last is repeated to fill the second temporal patch.
  const auto p = gmod::patchify_frames({a, a, a}, cfg);
  EXPECT_EQ(p.grid_thw[0], 2);
}

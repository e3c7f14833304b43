// SigLIP's image preprocessing (data/clip_preprocess.h with resize_square, as load_preprocess_config reads a
// SiglipImageProcessor config) against transformers' SiglipImageProcessor (PIL backend) on committed images:
// tests/fixtures/siglip/preprocess, written by tests/fixtures/make_siglip_fixtures.py from tests/fixtures/image.
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

#include "data/clip_preprocess.h"
#include "data/image.h"

namespace fs = std::filesystem;

namespace {

fs::path fixtures() {
  if (const char* root = std::getenv("GMOD_SOURCE_DIR")) return fs::path(root) / "tests/fixtures";
  return fs::path(__FILE__).parent_path().parent_path() / "fixtures";
}

template <typename T>
std::vector<T> read_raw(const fs::path& p, size_t count) {
  std::ifstream f(p, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open fixture " << p;
  const std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes.size(), count * sizeof(T)) << p;
  std::vector<T> out(count);
  std::memcpy(out.data(), bytes.data(), std::min(bytes.size(), count * sizeof(T)));
  return out;
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  if (!f) throw std::runtime_error(p.string() + ": missing (run tests/fixtures/make_siglip_fixtures.py)");
  nlohmann::json j;
  f >> j;
  return j;
}

// The image as PIL decodes it (tests/fixtures/image's manifest), so the preprocessing is compared alone.
gmod::Image pil_rgb(const std::string& file) {
  const auto m = read_json(fixtures() / "image/manifest.json");
  for (const auto& e : m["images"])
    if (e["file"] == file) {
      gmod::Image im;
      im.width = e["width"];
      im.height = e["height"];
      im.rgb = read_raw<uint8_t>(fixtures() / "image" / e["rgb"].get<std::string>(), size_t(im.width) * im.height * 3);
      return im;
    }
  throw std::runtime_error("no tests/fixtures/image manifest entry for " + file);
}

TEST(SiglipPreprocess, ReadsSiglipImageProcessorConfig) {
  const auto cfg = gmod::load_preprocess_config((fixtures() / "siglip/preprocess").string());
  EXPECT_TRUE(cfg.resize_square);
  EXPECT_EQ(cfg.size, 384);
  EXPECT_EQ(cfg.crop, 384);  // no crop_size: the resized image is the output
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(cfg.mean[c], 0.5f);
    EXPECT_EQ(cfg.std[c], 0.5f);
  }
}

TEST(SiglipPreprocess, MatchesSiglipImageProcessor) {
  const auto m = read_json(fixtures() / "siglip/preprocess/manifest.json");
  ASSERT_GE(m["cases"].size(), 5u);
  for (const auto& c : m["cases"]) {
    const std::string name = c["name"], image = c["image"];
    SCOPED_TRACE(name);
    gmod::ClipPreprocessConfig cfg;
    cfg.size = cfg.crop = c["size"];
    cfg.resize_square = true;
    cfg.pad_to_square = false;  // the processor alone (LLaVA's "pad" is a separate choice)
    cfg.mean = {0.5f, 0.5f, 0.5f};
    cfg.std = {0.5f, 0.5f, 0.5f};
    const size_t count = size_t(3) * cfg.size * cfg.size;
    const auto want = read_raw<float>(fixtures() / "siglip/preprocess" / c["pixels"].get<std::string>(), count);
    const auto from_pil = gmod::clip_preprocess(pil_rgb(image), cfg);
    const auto from_dec = gmod::clip_preprocess(gmod::decode_image_file((fixtures() / "image" / image).string()), cfg);
    ASSERT_EQ(from_pil.size(), count);
    ASSERT_EQ(from_dec.size(), count);
    double max_pil = 0, max_dec = 0;
    for (size_t i = 0; i < count; ++i) {
      max_pil = std::max(max_pil, std::fabs(double(from_pil[i]) - want[i]));
      max_dec = std::max(max_dec, std::fabs(double(from_dec[i]) - want[i]));
    }
    std::printf("[ info ] %-16s max |diff| %.3g from PIL pixels, %.3g end to end\n", name.c_str(), max_pil, max_dec);
    // The resize is Pillow's to the bit, so only float rounding remains; the JPEG decoders agree on these files
    // (test_image.cpp's DecodeMatchesPil), so end to end as well.
    EXPECT_LE(max_pil, 1e-6);
    EXPECT_LE(max_dec, 1e-6);
  }
  // The shortest-edge rule of CLIP would keep the aspect ratio: a landscape image must come out squashed instead.
  gmod::ClipPreprocessConfig clip_rule;
  clip_rule.size = clip_rule.crop = 24;
  clip_rule.pad_to_square = false;
  clip_rule.mean = clip_rule.std = {0.5f, 0.5f, 0.5f};
  const auto want = read_raw<float>(fixtures() / "siglip/preprocess/land_s24.bin", 3 * 24 * 24);
  const auto cropped = gmod::clip_preprocess(pil_rgb("land.jpg"), clip_rule);
  double d = 0;
  for (size_t i = 0; i < want.size(); ++i) d = std::max(d, std::fabs(double(cropped[i]) - want[i]));
  EXPECT_GT(d, 0.1) << "the fixture does not tell a squash from a shortest-edge resize and crop";
}

}  // namespace

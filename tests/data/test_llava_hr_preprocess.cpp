// LLaVA-HR's image preprocessing is gmod's CLIP pipeline (data/clip_preprocess.h) at input_image_size: the
// original's ConvNeXt-tower CLIPImageProcessor (CLIP mean/std, bicubic shortest-edge resize and crop to S)
// after expand2square with the mean colour, made by tests/fixtures/make_llava_hr_fixtures.py from the
// LLaVA-HR checkout.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "data/clip_preprocess.h"
#include "data/image.h"
#include "tests/common/paths.h"

TEST(LlavaHrPreprocess, MatchesTheOriginalProcessorAtInputImageSize) {
  std::ifstream f(gmod::test::fixture("llava_hr/preprocess.json"));
  ASSERT_TRUE(f) << "llava_hr/preprocess.json missing";
  nlohmann::json m;
  f >> m;
  int cases = 0;
  for (const auto& c : m.at("cases")) {
    gmod::ClipPreprocessConfig cfg;  // CLIP mean/std, pad to square: LLaVA-HR's settings
    cfg.size = cfg.crop = c.at("size").get<int>();
    const auto img =
        gmod::decode_image_file(gmod::test::fixture("image/" + c.at("image").get<std::string>()));
    const auto got = gmod::clip_preprocess(img, cfg);
    const size_t n = size_t(3) * cfg.crop * cfg.crop;
    std::vector<float> want(n);
    std::ifstream b(gmod::test::fixture("llava_hr/" + c.at("values").get<std::string>()), std::ios::binary);
    b.read(reinterpret_cast<char*>(want.data()), std::streamsize(n * sizeof(float)));
    ASSERT_TRUE(b) << c.at("values");
    ASSERT_EQ(got.size(), n);
    double worst = 0;
    for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
    EXPECT_LE(worst, 1e-5) << c.at("image");
    ++cases;
  }
  EXPECT_EQ(cases, 2);
}

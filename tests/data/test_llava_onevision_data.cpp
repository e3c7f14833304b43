// LLaVA-OneVision's images through gmod's AnyRes preparer (data/image_prep.h, chosen from the model's config and
// its preprocessor_config.json) against LlavaOnevisionImageProcessorPil and LlavaOnevisionProcessor
// (tests/fixtures/make_llava_onevision_fixtures.py -> tests/fixtures/hf/llava_onevision_tiny): per committed image,
// the tiles (the base image, the grid's tiles; for an image of a sample with several, its base image padded to a
// square with the mean colour), the token count (anyres_max_N's downscale, the multi-image rule) and the image_sizes
// row gmod carries; and records (tests/fixtures/make_llava_onevision_fixtures.py --data ->
// tests/fixtures/llava_onevision/data/) through Dataset and collate against the processor's ids, with a record of
// two images.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/batch.h"
#include "data/clip_preprocess.h"
#include "data/dataset.h"
#include "data/image.h"
#include "data/image_prep.h"
#include "data/tokenizer.h"
#include "model/anyres_grid.h"
#include "model/config.h"
#include "model/llava.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "tests/common/fixture_io.h"
#include "tests/common/paths.h"

namespace test_llava_onevision_data {

// test_anyres.cpp's bound for images Pillow resizes horizontal pass first (every image of this fixture).
constexpr float kPixelTol = 1e-5f;

std::string dir() { return gmod::test::fixture("hf/llava_onevision_tiny"); }

TEST(LlavaOnevisionData, TilesTokensAndSizesMatchTheProcessor) {
  const auto model = gmod::load_model_config(dir());
  ASSERT_TRUE(model.anyres && model.vision);
  const auto pre = gmod::load_preprocess_config(dir() + "/preprocessor_config.json");
  EXPECT_TRUE(pre.resize_square);
  EXPECT_EQ(pre.crop, model.vision->image_size);
  const auto prep = gmod::make_anyres_image_preparer(pre, *model.anyres, model.vision->patch_size,
                                                     model.image_token_id);
  EXPECT_NE(prep->describe().find("anyres_max_2"), std::string::npos) << prep->describe();
  const auto meta = gmod::test::read_reference(dir(), "tests/fixtures/make_llava_onevision_fixtures.py");
  gmod::SafetensorsFile ref(dir() + "/reference.safetensors");
  const auto pixels = ref.tensor("input.pixel_values").contiguous();  // [tiles, 3, S, S]
  const auto sizes = ref.tensor("input.image_sizes");
  const float* want = pixels.data_ptr<float>();
  const int64_t tile_values = pixels[0].numel();
  int64_t image = 0, tile = 0;
  double worst = 0;
  for (const auto& row : meta.at("images")) {
    for (const auto& name : row) {
      const std::string what = name.get<std::string>() + (row.size() > 1 ? " (one of several)" : "");
      const gmod::Image img = gmod::decode_image_file(gmod::test::fixture("image/" + name.get<std::string>()));
      const gmod::ImageTokens t = prep->tokens_among(img.width, img.height, row.size());
      EXPECT_EQ(t.count, meta.at("image_tokens")[image].get<int64_t>()) << what;
      EXPECT_EQ(t.id, model.image_token_id);
      const gmod::PreparedImage p = prep->prepare_among(img, row.size());
      const int64_t sign = row.size() > 1 ? -1 : 1;  // anyres_base_only
      EXPECT_EQ(p.image_size[0], sign * sizes[image][0].item<int64_t>()) << what;
      EXPECT_EQ(p.image_size[1], sign * sizes[image][1].item<int64_t>()) << what;
      const int64_t n = meta.at("tiles")[image].get<int64_t>();
      EXPECT_EQ(int64_t(p.pixels.size()), n * tile_values) << what;
      if (int64_t(p.pixels.size()) == n * tile_values && tile + n <= pixels.size(0)) {
        double err = 0;
        for (size_t k = 0; k < p.pixels.size(); ++k)
          err = std::max(err, double(std::fabs(p.pixels[k] - want[tile * tile_values + int64_t(k)])));
        EXPECT_LE(err, kPixelTol) << what;
        worst = std::max(worst, err);
      }
      tile += n;
      ++image;
    }
  }
  EXPECT_EQ(tile, pixels.size(0));
  std::printf("[ info ] %lld images, %lld tiles: max |pixel diff| %.3g\n", static_cast<long long>(image),
              static_cast<long long>(tile), worst);
  // One image alone: the count the model's config gives (anyres_image_tokens), the preparer's plain tokens().
  EXPECT_EQ(prep->tokens(37, 23).count, gmod::anyres_image_tokens(23, 37, *model.anyres, 16, 4));
  EXPECT_EQ(prep->tokens_among(37, 23, 1).count, 44);
  EXPECT_EQ(prep->tokens_among(37, 23, 3).count, 17);
}

std::string data_dir() { return gmod::test::fixture("llava_onevision/data"); }

// As the trainer sets it up (trainer/trainer.cpp setup_data): the processor's preprocessor_config.json, then the
// model's config chooses the image preparer; the fixture renders chatml.
gmod::DatasetConfig onevision_data(const gmod::Tokenizer& tok, const gmod::LlavaConfig& model) {
  gmod::DatasetConfig dc;
  dc.data_path = data_dir() + "/train.json";
  dc.image_folder = gmod::test::fixture("image");
  dc.use_index_cache = false;  // never write next to the committed fixture
  dc.conversation.template_name = "chatml";
  dc.conversation.image_token_id = model.image_token_id;
  dc.conversation.image_seq_length = 1;  // as the trainer sets it for size-dependent images: never used
  dc.sample.max_len = 4096;
  dc.image = gmod::load_preprocess_config(data_dir() + "/model/preprocessor_config.json");
  dc.image_preparer = gmod::make_image_preparer(model, dc.image, data_dir() + "/model", tok);
  dc.conversation.image_first = dc.image_preparer->image_first();
  return dc;
}

TEST(LlavaOnevisionData, SamplesMatchTheProcessorAndTheModelTakesTheBatch) {
  const std::shared_ptr<const gmod::Tokenizer> tok = gmod::load_tokenizer(data_dir() + "/model");
  const auto model_cfg = gmod::load_model_config(data_dir() + "/model");
  gmod::Dataset ds(onevision_data(*tok, model_cfg), tok);
  const auto ref = gmod::test::read_reference(data_dir(), "tests/fixtures/make_llava_onevision_fixtures.py --data");
  const auto& records = ref.at("records");
  ASSERT_EQ(records.size(), 4u);
  std::vector<gmod::PreparedSample> samples;
  int64_t want_tiles = 0;
  for (size_t k = 0; k < records.size(); ++k) {
    const auto& r = records[k];
    gmod::PreparedSample p = ds.prepare(k);
    const auto want = r["input_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(p.sample.ids, want) << r["id"];
    std::vector<int32_t> labels(want.size(), gmod::kIgnoreIndex);
    for (int64_t t = r["answer"][0].get<int64_t>(); t < r["answer"][1].get<int64_t>(); ++t)
      labels[size_t(t)] = want[size_t(t)];
    EXPECT_EQ(p.sample.labels, labels) << r["id"];
    const auto sizes = r["image_sizes"].get<std::vector<std::vector<int64_t>>>();
    ASSERT_EQ(p.image_sizes.size(), sizes.size()) << r["id"];
    const int64_t sign = sizes.size() > 1 ? -1 : 1;  // several images: base tiles only (anyres_base_only)
    for (size_t i = 0; i < sizes.size(); ++i) {
      EXPECT_EQ(p.image_sizes[i][0], sign * sizes[i][0]) << r["id"];
      EXPECT_EQ(p.image_sizes[i][1], sign * sizes[i][1]) << r["id"];
      want_tiles += gmod::anyres_num_tiles(int(p.image_sizes[i][0]), int(p.image_sizes[i][1]), *model_cfg.anyres, 16);
    }
    samples.push_back(std::move(p));
  }
  gmod::Batch b = gmod::collate(samples, ds.encoder().pad_id(), ds.config().image.crop);
  ASSERT_TRUE(b.image_sizes.defined());
  EXPECT_EQ(b.image_sizes.size(0), 5);
  EXPECT_EQ(b.pixel_values.sizes(), (std::vector<int64_t>{want_tiles, 3, 16, 16}));
  EXPECT_EQ(want_tiles, 7 + 1 + 1 + 5 + 3);
  // The collated batch runs through the saved model: every image's features fill its positions.
  auto model = gmod::load_pretrained(data_dir() + "/model");
  at::NoGradGuard ng;
  const auto out = model->forward(gmod::to_model_inputs(b, at::kCPU));
  EXPECT_TRUE(std::isfinite(out.lm_loss.item<double>()));
}

}  // namespace test_llava_onevision_data

// LLaVA-NeXT (AnyRes) samples through gmod's data pipeline (data/image_prep.h's AnyRes preparer, Dataset, collate,
// collate_packed) against transformers' LlavaNextProcessor (tests/fixtures/make_llava_next_fixtures.py --data ->
// tests/fixtures/llava_next/data/): the ids exactly (the image's token count: base + unpadded grid + one newline a
// row), the supervised span exactly, image_sizes exactly, the tiles within test_anyres.cpp's bound; and the model run
// on the collated batch of records with different tile counts (3 and 5) against LlavaNextForConditionalGeneration on
// the processor's outputs, each record alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/batch.h"
#include "data/dataset.h"
#include "data/image_prep.h"
#include "data/pack.h"
#include "data/tokenizer.h"
#include "model/anyres_grid.h"
#include "model/config.h"
#include "model/llava.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "tests/common/fixture_io.h"
#include "tests/common/paths.h"

using gmod::test::fixture;

namespace {

// test_anyres.cpp's bound for images Pillow resizes horizontal pass first (every image of this fixture).
constexpr float kPixelTol = 1e-5f;
constexpr size_t kRecords = 4;

std::string dir() { return fixture("llava_next/data"); }

nlohmann::json reference() {
  return gmod::test::read_reference(dir(), "tests/fixtures/make_llava_next_fixtures.py --data");
}

using gmod::test::read_floats;

struct NextData {
  std::shared_ptr<const gmod::Tokenizer> tok;
  gmod::LlavaConfig model;
  gmod::DatasetConfig dc;
};

// As the trainer sets it up (trainer/trainer.cpp setup_data): the processor's preprocessor_config.json, then the
// model's config chooses the image preparer; the fixture renders chatml.
NextData next_data(int max_len = 4096) {
  NextData s;
  s.tok = gmod::load_tokenizer(dir() + "/model");
  s.model = gmod::load_model_config(dir() + "/model");
  s.dc.data_path = dir() + "/train.json";
  s.dc.image_folder = fixture("image");
  s.dc.use_index_cache = false;  // never write next to the committed fixture
  s.dc.conversation.template_name = "chatml";
  s.dc.conversation.image_token_id = s.model.image_token_id;
  s.dc.conversation.image_seq_length = 1;  // as the trainer sets it for size-dependent images: never used
  s.dc.sample.max_len = max_len;
  s.dc.image = gmod::load_preprocess_config(dir() + "/model/preprocessor_config.json");
  s.dc.image_preparer = gmod::make_image_preparer(s.model, s.dc.image, dir() + "/model", *s.tok);
  s.dc.conversation.image_first = s.dc.image_preparer->image_first();
  return s;
}

}  // namespace

TEST(LlavaNextData, PreparerComesFromTheModelConfig) {
  const NextData s = next_data();
  ASSERT_TRUE(s.model.anyres);
  EXPECT_TRUE(s.dc.image_preparer->size_dependent());
  EXPECT_TRUE(s.dc.image_preparer->image_first());
  // land.jpg, 23 (h) x 37 (w) at 16 px tiles of 4 px patches: the count model/anyres_grid.h gives, which is
  // LlavaNextProcessor's (tests/fixtures/anyres/manifest.json, land_v16; SamplesMatchTheProcessor checks the ids).
  const gmod::ImageTokens t = s.dc.image_preparer->tokens(37, 23);
  EXPECT_EQ(t.count, gmod::anyres_image_tokens(23, 37, *s.model.anyres, 16, 4));
  EXPECT_EQ(t.count, 52);
  EXPECT_EQ(t.id, s.model.image_token_id);
  EXPECT_FALSE(t.start || t.end);
  // A processor whose crop is not the tower's image size is refused, naming both.
  gmod::ClipPreprocessConfig other = s.dc.image;
  other.crop = other.size = 32;
  try {
    gmod::make_image_preparer(s.model, other, dir() + "/model", *s.tok);
    ADD_FAILURE() << "expected a refusal";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("crop size 32 is not the vision tower's image_size 16"), std::string::npos)
        << e.what();
  }
}

TEST(LlavaNextData, SamplesMatchTheProcessor) {
  const NextData s = next_data();
  gmod::Dataset ds(s.dc, s.tok);
  const auto ref = reference();
  ASSERT_EQ(ref["records"].size(), kRecords);
  std::vector<gmod::PreparedSample> samples;
  for (size_t k = 0; k < kRecords; ++k) {
    const auto& r = ref["records"][k];
    gmod::PreparedSample p = ds.prepare(k);
    const auto want = r["input_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(p.sample.ids, want) << r["id"];
    std::vector<int32_t> labels(want.size(), gmod::kIgnoreIndex);
    for (int64_t t = r["answer"][0].get<int64_t>(); t < r["answer"][1].get<int64_t>(); ++t)
      labels[size_t(t)] = want[size_t(t)];
    EXPECT_EQ(p.sample.labels, labels) << r["id"];
    for (size_t t = 0; t < p.sample.ids.size(); ++t)
      EXPECT_EQ(p.sample.roles[t] == gmod::TokenRole::kImage, p.sample.ids[t] == s.model.image_token_id) << t;
    ASSERT_EQ(p.image_sizes.size(), 1u) << r["id"];
    EXPECT_EQ(std::vector<int64_t>(p.image_sizes[0].begin(), p.image_sizes[0].end()),
              r["image_sizes"][0].get<std::vector<int64_t>>());
    EXPECT_TRUE(p.grids.empty());
    samples.push_back(std::move(p));
  }
  // Collated: every image's tiles stacked in order (5, 5, 3, 3), image_sizes [4, 2].
  gmod::Batch b = gmod::collate(samples, ds.encoder().pad_id(), ds.config().image.crop);
  ASSERT_TRUE(b.image_sizes.defined());
  ASSERT_EQ(b.image_sizes.size(0), int64_t(kRecords));
  EXPECT_FALSE(b.image_grid_thw.defined());
  int64_t tile = 0;
  size_t off = 0;
  float worst = 0.0f;
  for (size_t k = 0; k < kRecords; ++k) {
    const auto& r = ref["records"][k];
    const auto shape = r["pixel_values_shape"].get<std::vector<int64_t>>();
    ASSERT_EQ(shape.size(), 4u);
    const size_t n = size_t(shape[0] * shape[1] * shape[2] * shape[3]);
    const auto want = read_floats(dir() + "/" + r["pixel_values"].get<std::string>(), n);
    const float* got = b.pixel_values.data_ptr<float>() + tile * 3 * 16 * 16;
    for (size_t i = 0; i < n; ++i) {
      const float d = std::abs(got[i] - want[i]);
      off += d > kPixelTol;
      worst = std::max(worst, d);
    }
    EXPECT_EQ(b.image_sizes[int64_t(k)][0].item<int64_t>(), r["image_sizes"][0][0].get<int64_t>());
    EXPECT_EQ(b.image_sizes[int64_t(k)][1].item<int64_t>(), r["image_sizes"][0][1].get<int64_t>());
    tile += shape[0];
  }
  EXPECT_EQ(b.pixel_values.sizes(), (std::vector<int64_t>{tile, 3, 16, 16}));
  std::printf("pixel_values: %lld tiles, %zu of %lld values off by more than %g, worst %g\n",
              static_cast<long long>(tile), off, static_cast<long long>(b.pixel_values.numel()), double(kPixelTol),
              double(worst));
  EXPECT_EQ(off, 0u) << "worst difference " << worst;
  const gmod::ModelInputs in = gmod::to_model_inputs(b, at::kCPU);
  EXPECT_TRUE(in.image_sizes.defined() && in.image_sizes.equal(b.image_sizes));
}

TEST(LlavaNextData, CollateRefusesMixedAndRaggedImages) {
  const NextData s = next_data();
  gmod::Dataset ds(s.dc, s.tok);
  {
    std::vector<gmod::PreparedSample> samples = {ds.prepare(0), ds.prepare(2)};
    samples[1].image_sizes.clear();  // as a fixed-size crop would come
    samples[1].pixels[0].assign(3 * 16 * 16, 0.0f);
    try {
      gmod::collate(samples, ds.encoder().pad_id(), 16);
      ADD_FAILURE() << "expected a refusal";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("mixes AnyRes images (1) with other kinds (1)"), std::string::npos)
          << e.what();
    }
  }
  {
    std::vector<gmod::PreparedSample> samples = {ds.prepare(0)};
    samples[0].pixels[0].pop_back();
    try {
      gmod::collate(samples, ds.encoder().pad_id(), 16);
      ADD_FAILURE() << "expected a refusal";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("anyres_0 has 3839 values, not a whole number of 3x16x16 tiles"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(LlavaNextData, TruncationNeverSplitsAnImage) {
  // Record 0's only round ends with its answer: a budget inside it (after the image, before the answer's end) makes
  // the record too long, never a cut image or answer.
  const auto ref = reference();
  const int from = ref["records"][0]["logits_from"].get<int>();
  const NextData s = next_data(from - 3);  // inside the image's span
  gmod::Dataset ds(s.dc, s.tok);
  try {
    ds.prepare(0);
    ADD_FAILURE() << "expected too_long";
  } catch (const gmod::SampleError& e) {
    EXPECT_EQ(e.reason(), "too_long") << e.what();
  }
}

namespace {

// The logits of record k from its first position after the image, as the reference holds them.
double worst_logit_diff(const at::Tensor& row, int64_t from, const at::Tensor& theirs) {
  const at::Tensor ours = row.narrow(0, from, theirs.size(0));
  return (ours - theirs).abs().max().item<double>();
}

}  // namespace

// The collated batch (four records, 5, 5, 3 and 3 tiles, right padding) drives the model as the processor's outputs
// drive transformers, each record alone: logits at every position after the image (where every image feature is
// attended) and the batch's loss within 1e-5, test_llava_next.cpp's / test_hf_parity.cpp's bounds. The weights are
// N(0, 0.15), far from uniform attention, so that images move the logits well beyond the bound.
TEST(LlavaNextData, ModelOnTheBatchMatchesTransformers) {
  const NextData s = next_data();
  gmod::Dataset ds(s.dc, s.tok);
  std::vector<gmod::PreparedSample> samples;
  for (size_t k = 0; k < kRecords; ++k) samples.push_back(ds.prepare(k));
  const gmod::Batch b = gmod::collate(samples, ds.encoder().pad_id(), ds.config().image.crop);
  auto model = gmod::load_pretrained(dir() + "/model");
  model->eval();
  at::NoGradGuard no_grad;
  const gmod::ModelOutput out = model->forward(gmod::to_model_inputs(b, at::kCPU));
  gmod::SafetensorsFile ref(dir() + "/reference.safetensors");
  const auto r = reference();
  double worst = 0, spread = 0;
  for (size_t k = 0; k < kRecords; ++k) {
    const at::Tensor theirs = ref.tensor("record" + std::to_string(k) + ".logits");
    worst = std::max(worst, worst_logit_diff(out.logits[int64_t(k)], r["records"][k]["logits_from"].get<int64_t>(),
                                             theirs));
    spread = std::max(spread, theirs.std().item<double>());
  }
  const double loss = out.lm_loss.item<double>(), want = ref.tensor("batch_loss").item<double>();
  std::printf("logits after the images: max abs difference %.3g (logit std %.3g); loss %.6f vs %.6f\n", worst,
              spread, loss, want);
  EXPECT_GT(spread, 0.1) << "the reference logits are too flat to tell anything";
  EXPECT_LT(worst, 1e-5);
  EXPECT_NEAR(loss, want, 1e-5);
}

// Packing AnyRes samples (data.pack_to): all four records in one row through collate_packed (reordered longest first,
// their tiles and image_sizes with them) give transformers' logits for each record and the unpadded batch's loss.
TEST(LlavaNextData, PackedSamplesMatchTransformers) {
  const NextData s = next_data();
  gmod::Dataset ds(s.dc, s.tok);
  std::vector<gmod::PreparedSample> unpacked, packed;
  int64_t total = 0;
  for (size_t k = 0; k < kRecords; ++k) {
    unpacked.push_back(ds.prepare(k));
    packed.push_back(ds.prepare(k));
    total += int64_t(packed.back().sample.ids.size());
  }
  const gmod::Batch u = gmod::collate(unpacked, ds.encoder().pad_id(), ds.config().image.crop);
  const gmod::Batch p = gmod::collate_packed(packed, ds.encoder().pad_id(), ds.config().image.crop, total);
  ASSERT_EQ(p.input_ids.size(0), 1) << "all samples in one row";
  ASSERT_TRUE(p.image_sizes.defined());
  ASSERT_EQ(p.image_sizes.size(0), int64_t(kRecords));
  auto model = gmod::load_pretrained(dir() + "/model");
  model->eval();
  at::NoGradGuard no_grad;
  const gmod::ModelOutput uo = model->forward(gmod::to_model_inputs(u, at::kCPU));
  const gmod::ModelOutput po = model->forward(gmod::to_model_inputs(p, at::kCPU));
  gmod::SafetensorsFile ref(dir() + "/reference.safetensors");
  const auto r = reference();
  double worst = 0;
  int64_t start = 0;
  for (size_t j = 0; j < kRecords; ++j) {
    const size_t k = size_t(std::find(u.ids.begin(), u.ids.end(), p.ids[j]) - u.ids.begin());
    ASSERT_LT(k, kRecords);
    const int64_t n = int64_t(r["records"][k]["input_ids"].size());
    const at::Tensor theirs = ref.tensor("record" + std::to_string(k) + ".logits");
    worst = std::max(worst, worst_logit_diff(po.logits[0].narrow(0, start, n),
                                             r["records"][k]["logits_from"].get<int64_t>(), theirs));
    start += n;
  }
  std::printf("packed vs transformers: max abs logit difference %.3g; loss %.6f vs %.6f unpacked\n", worst,
              po.lm_loss.item<double>(), uo.lm_loss.item<double>());
  EXPECT_EQ(start, total);
  EXPECT_LT(worst, 1e-5);
  EXPECT_EQ(po.supervised_tokens, uo.supervised_tokens);
  EXPECT_NEAR(po.lm_loss.item<double>(), uo.lm_loss.item<double>(), 1e-5);
}

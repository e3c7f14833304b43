// Qwen2.5-VL samples through gmod's data pipeline (data/image_prep.h, Dataset, collate) against transformers'
// Qwen2_5_VLProcessor (tests/fixtures/make_qwen2_5_vl_data_fixtures.py -> tests/fixtures/qwen2_5_vl/data/): the ids
// exactly, the supervised spans exactly, image_grid_thw exactly, pixel_values within kFloatTol; and the model run on
// the collated batch against transformers' on the processor's outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/batch.h"
#include "data/dataset.h"
#include "data/image_prep.h"
#include "data/pack.h"
#include "data/tokenizer.h"
#include "model/config.h"
#include "model/llava.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "tests/common/fixture_io.h"
#include "tests/common/paths.h"

using gmod::test::fixture;

// A named namespace around the file keeps its helpers apart from other files in a unity build.
namespace test_qwen2_5_vl_data {
namespace {

// The processor's resize, rescale and normalisation are the ones test_native_resolution.cpp checks value for value
// (measured 0 difference); the tolerance only absorbs a compiler contracting (v - m) / s differently.
constexpr float kFloatTol = 1e-6f;

std::string dir() { return fixture("qwen2_5_vl/data"); }

nlohmann::json reference() {
  return gmod::test::read_reference(dir(), "tests/fixtures/make_qwen2_5_vl_data_fixtures.py");
}

using gmod::test::read_floats;

struct QwenData {
  std::shared_ptr<const gmod::Tokenizer> tok;
  gmod::LlavaConfig model;
  gmod::DatasetConfig dc;
};

// As the trainer sets it up (trainer/trainer.cpp setup_data): the model's config and processor files choose the
// image preparer; the family's template is chatml.
QwenData qwen_data(int max_len = 4096) {
  QwenData s;
  s.tok = gmod::load_tokenizer(dir() + "/model");
  s.model = gmod::load_model_config(dir() + "/model");
  s.dc.data_path = dir() + "/train.json";
  s.dc.image_folder = fixture("image");
  s.dc.use_index_cache = false;  // never write next to the committed fixture
  s.dc.conversation.template_name = gmod::resolve_conversation_template("auto", s.model.text);
  s.dc.conversation.image_token_id = s.model.image_token_id;
  s.dc.sample.max_len = max_len;
  s.dc.image_preparer = gmod::make_image_preparer(s.model, s.dc.image, dir() + "/model", *s.tok);
  s.dc.conversation.image_first = s.dc.image_preparer->image_first();
  return s;
}

}  // namespace

TEST(Qwen25VlData, PreparerComesFromTheModelConfig) {
  const QwenData s = qwen_data();
  EXPECT_EQ(s.dc.conversation.template_name, "chatml");
  EXPECT_TRUE(s.dc.image_preparer->size_dependent());
  EXPECT_FALSE(s.dc.image_preparer->image_first());
  // 37x23 -> 24x36 at factor 4: a 12x18 patch grid, 54 merged tokens between <|vision_start|> and <|vision_end|>.
  const gmod::ImageTokens t = s.dc.image_preparer->tokens(37, 23);
  EXPECT_EQ(t.count, 54);
  EXPECT_EQ(t.id, s.model.image_token_id);
  ASSERT_TRUE(t.start && t.end);
  EXPECT_EQ(*t.start, *s.tok->token_to_id("<|vision_start|>"));
  EXPECT_EQ(*t.end, *s.tok->token_to_id("<|vision_end|>"));
  // A tokenizer whose <|image_pad|> is not the model's image token is refused, naming both.
  gmod::LlavaConfig other = s.model;
  other.image_token_id += 1;
  try {
    gmod::make_image_preparer(other, s.dc.image, dir() + "/model", *s.tok);
    ADD_FAILURE() << "expected a refusal";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("<|image_pad|>"), std::string::npos) << e.what();
  }
}

TEST(Qwen25VlData, SamplesMatchTheProcessor) {
  const QwenData s = qwen_data();
  gmod::Dataset ds(s.dc, s.tok);
  const auto ref = reference();
  ASSERT_EQ(ref["records"].size(), 2u);
  std::vector<gmod::PreparedSample> samples;
  for (size_t k = 0; k < 2; ++k) {
    const auto& r = ref["records"][k];
    gmod::PreparedSample p = ds.prepare(k);
    const auto want = r["input_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(p.sample.ids, want) << r["id"];
    // Supervised: exactly the answer ranges, with the ids themselves as labels.
    std::vector<int32_t> labels(want.size(), gmod::kIgnoreIndex);
    for (const auto& a : r["answers"])
      for (int64_t t = a[0].get<int64_t>(); t < a[1].get<int64_t>(); ++t) labels[size_t(t)] = want[size_t(t)];
    EXPECT_EQ(p.sample.labels, labels) << r["id"];
    // Image positions: the <|image_pad|> ids, nothing else.
    for (size_t t = 0; t < p.sample.ids.size(); ++t)
      EXPECT_EQ(p.sample.roles[t] == gmod::TokenRole::kImage, p.sample.ids[t] == s.model.image_token_id) << t;
    ASSERT_EQ(p.grids.size(), r["image_grid_thw"].size()) << r["id"];
    for (size_t i = 0; i < p.grids.size(); ++i)
      EXPECT_EQ(std::vector<int64_t>(p.grids[i].begin(), p.grids[i].end()),
                r["image_grid_thw"][i].get<std::vector<int64_t>>());
    samples.push_back(std::move(p));
  }
  // Collated: the patches of both samples concatenated in order, the grids stacked, row size 3 * T * P * P = 24.
  gmod::Batch b = gmod::collate(samples, ds.encoder().pad_id(), ds.config().image.crop);
  ASSERT_TRUE(b.image_grid_thw.defined());
  ASSERT_EQ(b.image_grid_thw.size(0), 3);
  int64_t row = 0;
  size_t off = 0;
  float worst = 0.0f;
  for (size_t k = 0; k < 2; ++k) {
    const auto& r = ref["records"][k];
    const auto shape = r["pixel_values_shape"].get<std::vector<int64_t>>();
    ASSERT_EQ(b.pixel_values.size(1), shape[1]);
    const auto want = read_floats(dir() + "/" + r["pixel_values"].get<std::string>(), size_t(shape[0] * shape[1]));
    const float* got = b.pixel_values.data_ptr<float>() + row * shape[1];
    for (size_t i = 0; i < want.size(); ++i) {
      const float d = std::abs(got[i] - want[i]);
      off += d > kFloatTol;
      worst = std::max(worst, d);
    }
    row += shape[0];
  }
  EXPECT_EQ(b.pixel_values.size(0), row);
  std::printf("pixel_values: %zu of %lld values off by more than %g, worst %g\n", off,
              static_cast<long long>(b.pixel_values.numel()), double(kFloatTol), double(worst));
  EXPECT_EQ(off, 0u) << "worst difference " << worst;
  const std::vector<int64_t> grids = {1, 12, 18, 1, 20, 10, 1, 12, 20};
  EXPECT_TRUE(b.image_grid_thw.flatten().equal(at::tensor(grids, at::kLong)));
  const gmod::ModelInputs in = gmod::to_model_inputs(b, at::kCPU);
  EXPECT_TRUE(in.image_grid_thw.defined() && in.image_grid_thw.equal(b.image_grid_thw));
  // Packed (PackedImageSamplesMatchUnpacked checks the model on it), the grids travel with their samples.
  std::vector<gmod::PreparedSample> again = {ds.prepare(1), ds.prepare(2)};
  const gmod::Batch p = gmod::collate_packed(again, ds.encoder().pad_id(), ds.config().image.crop, 4096);
  ASSERT_TRUE(p.image_grid_thw.defined());
  EXPECT_EQ(p.image_grid_thw.size(0), 2);
}

TEST(Qwen25VlData, CollateRefusesMixedImageKinds) {
  const QwenData s = qwen_data();
  gmod::Dataset ds(s.dc, s.tok);
  std::vector<gmod::PreparedSample> samples = {ds.prepare(1), ds.prepare(2)};
  samples[1].grids.clear();  // as a fixed-size crop would come
  samples[1].pixels[0].assign(3 * 8 * 8, 0.0f);
  try {
    gmod::collate(samples, ds.encoder().pad_id(), 8);
    ADD_FAILURE() << "expected a refusal";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("mixes native-resolution images (1) with fixed-size crops (1)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Qwen25VlData, TruncationKeepsWholeImagesOfWholeRounds) {
  // Record 0: round 1 (two images) ends with its answer's <|im_end|>, after 164 tokens (the "\n" after it starts
  // the next round, as the encoder lays chatml out); the whole record is 214.
  const auto ref = reference();
  const auto answers = ref["records"][0]["answers"];
  const int round1 = answers[0][1].get<int>();
  {
    const QwenData s = qwen_data(round1 + 10);
    gmod::Dataset ds(s.dc, s.tok);
    const gmod::PreparedSample p = ds.prepare(0);
    EXPECT_TRUE(p.sample.truncated);
    EXPECT_EQ(int(p.sample.ids.size()), round1);
    EXPECT_EQ(p.sample.images.size(), 2u);
    EXPECT_EQ(p.grids.size(), 2u);
    const auto want = ref["records"][0]["input_ids"].get<std::vector<int32_t>>();
    EXPECT_TRUE(std::equal(p.sample.ids.begin(), p.sample.ids.end(), want.begin()));
  }
  {
    // Cutting inside the first round (inside the second image's span) is never done: the record is too long.
    const QwenData s = qwen_data(100);
    gmod::Dataset ds(s.dc, s.tok);
    try {
      ds.prepare(0);
      ADD_FAILURE() << "expected too_long";
    } catch (const gmod::SampleError& e) {
      EXPECT_EQ(e.reason(), "too_long") << e.what();
    }
  }
}

TEST(Qwen25VlData, MissingImageIsANamedBadRecord) {
  QwenData s = qwen_data();
  s.dc.image_folder = fixture("no_such_folder");
  gmod::Dataset ds(s.dc, s.tok);
  gmod::PreparedSample p;
  gmod::BadRecord bad;
  EXPECT_FALSE(ds.try_prepare(1, p, bad));
  EXPECT_EQ(bad.reason, "image");
  EXPECT_NE(bad.message.find("big.png"), std::string::npos) << bad.message;
  EXPECT_EQ(bad.id, "llava_one_image");
}

// The collated batch drives the model as the processor's outputs drive transformers: both records as one right-padded
// batch (M-RoPE ids from Batch::image_grid_thw, the tower on the concatenated patches) against each record run alone
// in Qwen2_5_VLForConditionalGeneration (the fixture's weights are far from uniform attention, so that positions and
// image features move the logits well beyond the bound): logits at every supervised position and the batch's loss
// within 1e-5, test_hf_parity.cpp's bounds.
TEST(Qwen25VlData, ModelOnTheBatchMatchesTransformers) {
  const QwenData s = qwen_data();
  gmod::Dataset ds(s.dc, s.tok);
  std::vector<gmod::PreparedSample> samples = {ds.prepare(0), ds.prepare(1)};
  const gmod::Batch b = gmod::collate(samples, ds.encoder().pad_id(), ds.config().image.crop);
  auto model = gmod::load_pretrained(dir() + "/model");
  model->eval();
  const gmod::ModelInputs in = gmod::to_model_inputs(b, at::kCPU);
  at::NoGradGuard no_grad;
  const gmod::ModelOutput out = model->forward(in);
  gmod::SafetensorsFile ref(dir() + "/reference.safetensors");
  const auto r = reference();
  double worst = 0;
  for (int64_t k = 0; k < 2; ++k) {
    std::vector<int64_t> positions;
    for (const auto& a : r["records"][size_t(k)]["answers"])
      for (int64_t t = a[0].get<int64_t>(); t < a[1].get<int64_t>(); ++t) positions.push_back(t);
    const at::Tensor ours = out.logits[k].index_select(0, at::tensor(positions, at::kLong));
    const at::Tensor theirs = ref.tensor("record" + std::to_string(k) + ".answer_logits");
    ASSERT_EQ(ours.sizes(), theirs.sizes());
    worst = std::max(worst, (ours - theirs).abs().max().item<double>());
  }
  const double loss = out.lm_loss.item<double>(), want = ref.tensor("batch_loss").item<double>();
  std::printf("logits at %d supervised positions: max abs difference %.3g; loss %.6f vs %.6f\n",
              int(out.supervised_tokens), worst, loss, want);
  EXPECT_LT(worst, 1e-5);
  EXPECT_NEAR(loss, want, 1e-5);
}

// Packing native-resolution samples (data.pack_to): both records laid end to end in one row through collate_packed
// (the longer first, so the grids are reordered with their samples) give, through the model, the logits of the
// unpadded batch at every real token of each sample and the same loss, within 1e-5 (test_hf_parity.cpp's bound): each
// segment gets its own sample's 3-D ids and images. The packed row's supervised logits are also checked against
// transformers' (each record alone, the fixture's reference).
TEST(Qwen25VlData, PackedImageSamplesMatchUnpacked) {
  const QwenData s = qwen_data();
  gmod::Dataset ds(s.dc, s.tok);
  std::vector<gmod::PreparedSample> unpacked_samples = {ds.prepare(0), ds.prepare(1)};
  std::vector<gmod::PreparedSample> packed_samples = {ds.prepare(0), ds.prepare(1)};
  const int64_t n0 = int64_t(unpacked_samples[0].sample.ids.size());
  const int64_t n1 = int64_t(unpacked_samples[1].sample.ids.size());
  const gmod::Batch u = gmod::collate(unpacked_samples, ds.encoder().pad_id(), ds.config().image.crop);
  const gmod::Batch p = gmod::collate_packed(packed_samples, ds.encoder().pad_id(), ds.config().image.crop, n0 + n1);
  ASSERT_EQ(p.input_ids.size(0), 1) << "both samples in one row";
  ASSERT_EQ(p.input_ids.size(1), n0 + n1);
  ASSERT_TRUE(p.image_grid_thw.defined());
  ASSERT_EQ(p.image_grid_thw.size(0), u.image_grid_thw.size(0));
  auto model = gmod::load_pretrained(dir() + "/model");
  model->eval();
  at::NoGradGuard no_grad;
  const gmod::ModelOutput uo = model->forward(gmod::to_model_inputs(u, at::kCPU));
  const gmod::ModelOutput po = model->forward(gmod::to_model_inputs(p, at::kCPU));
  // Where each record sits in the packed row: the row's samples in placement order (p.ids).
  ASSERT_EQ(p.ids.size(), 2u);
  gmod::SafetensorsFile ref(dir() + "/reference.safetensors");
  const auto r = reference();
  double worst = 0, worst_ref = 0;
  int64_t start = 0;
  for (size_t j = 0; j < 2; ++j) {
    const size_t k = p.ids[j] == u.ids[0] ? 0 : 1;
    ASSERT_EQ(p.ids[j], u.ids[k]);
    const int64_t n = k == 0 ? n0 : n1;
    const at::Tensor packed = po.logits[0].narrow(0, start, n), alone = uo.logits[int64_t(k)].narrow(0, 0, n);
    worst = std::max(worst, (packed - alone).abs().max().item<double>());
    std::vector<int64_t> positions;
    for (const auto& a : r["records"][k]["answers"])
      for (int64_t t = a[0].get<int64_t>(); t < a[1].get<int64_t>(); ++t) positions.push_back(t);
    const at::Tensor theirs = ref.tensor("record" + std::to_string(k) + ".answer_logits");
    worst_ref = std::max(worst_ref,
                         (packed.index_select(0, at::tensor(positions, at::kLong)) - theirs).abs().max().item<double>());
    start += n;
  }
  std::printf("packed vs unpacked logits: max abs %.3g; packed vs transformers %.3g; loss %.6f vs %.6f\n", worst,
              worst_ref, po.lm_loss.item<double>(), uo.lm_loss.item<double>());
  EXPECT_LT(worst, 1e-5);
  EXPECT_LT(worst_ref, 1e-5);
  EXPECT_EQ(po.supervised_tokens, uo.supervised_tokens);
  EXPECT_NEAR(po.lm_loss.item<double>(), uo.lm_loss.item<double>(), 1e-5);
}

}  // namespace test_qwen2_5_vl_data

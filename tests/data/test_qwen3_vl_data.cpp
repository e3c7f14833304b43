// Qwen3-VL samples through gmod's data pipeline (data/image_prep.h, Dataset, collate) against transformers'
// Qwen3VLProcessor (tests/fixtures/make_qwen3_vl_data_fixtures.py -> tests/fixtures/qwen3_vl/data/): the preparer comes
// from the model's Qwen3-VL vision config and the preprocessor_config.json Qwen3-VL's keys (size.shortest_edge /
// longest_edge, mean = std = 0.5); ids, supervised spans and image_grid_thw exactly, pixel_values within kFloatTol;
// and the model (DeepStack, interleaved M-RoPE) run on the collated batch against transformers' on the processor's
// outputs.
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
#include "data/video_prep.h"
#include "model/config.h"
#include "model/llava.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "tests/common/fixture_io.h"
#include "tests/common/paths.h"

using gmod::test::fixture;

// A named namespace around the file keeps its helpers apart from other files in a unity build.
namespace test_qwen3_vl_data {
namespace {

// As test_qwen2_5_vl_data.cpp: the resize and normalisation are value for value the processor's; the tolerance only
// absorbs a compiler contracting (v - m) / s differently.
constexpr float kFloatTol = 1e-6f;

std::string dir() { return fixture("qwen3_vl/data"); }

nlohmann::json reference() {
  return gmod::test::read_reference(dir(), "tests/fixtures/make_qwen3_vl_data_fixtures.py");
}

using gmod::test::read_floats;

struct QwenData {
  std::shared_ptr<const gmod::Tokenizer> tok;
  gmod::LlavaConfig model;
  gmod::DatasetConfig dc;
};

// As the trainer sets it up (trainer/trainer.cpp setup_data).
QwenData qwen_data() {
  QwenData s;
  s.tok = gmod::load_tokenizer(dir() + "/model");
  s.model = gmod::load_model_config(dir() + "/model");
  s.dc.data_path = dir() + "/train.json";
  s.dc.image_folder = fixture("image");
  s.dc.use_index_cache = false;  // never write next to the committed fixture
  s.dc.conversation.template_name = gmod::resolve_conversation_template("auto", s.model.text);
  s.dc.conversation.image_token_id = s.model.image_token_id;
  s.dc.sample.max_len = 4096;
  s.dc.image_preparer = gmod::make_image_preparer(s.model, s.dc.image, dir() + "/model", *s.tok);
  s.dc.conversation.image_first = s.dc.image_preparer->image_first();
  return s;
}

constexpr size_t kRecords = 3;  // two images, one image, text only

}  // namespace

TEST(Qwen3VlData, PreparerComesFromTheModelConfig) {
  const QwenData s = qwen_data();
  ASSERT_TRUE(s.model.qwen3_vision.has_value());
  EXPECT_FALSE(s.model.qwen_vision.has_value());
  // Qwen3-VL's template: chatml without a default system block (the processor's ids below have none).
  EXPECT_EQ(s.dc.conversation.template_name, "qwen3_vl");
  EXPECT_TRUE(s.dc.image_preparer->size_dependent());
  EXPECT_FALSE(s.dc.image_preparer->image_first());
  // 37x23 -> 24x36 at factor 4: 54 merged tokens; 100x100 is above size.longest_edge (1024) -> 32x32: 64.
  const gmod::ImageTokens t = s.dc.image_preparer->tokens(37, 23);
  EXPECT_EQ(t.count, 54);
  EXPECT_EQ(s.dc.image_preparer->tokens(100, 100).count, 64);
  EXPECT_EQ(t.id, s.model.image_token_id);
  ASSERT_TRUE(t.start && t.end);
  EXPECT_EQ(*t.start, *s.tok->token_to_id("<|vision_start|>"));
  EXPECT_EQ(*t.end, *s.tok->token_to_id("<|vision_end|>"));
  // The processor's patch geometry must be the encoder's: a Qwen3-VL encoder of patch 16 (the released models') with
  // this patch-2 preprocessor_config.json is refused, naming both.
  gmod::LlavaConfig other = s.model;
  other.qwen3_vision->patch_size = 16;
  try {
    gmod::make_image_preparer(other, s.dc.image, dir() + "/model", *s.tok);
    ADD_FAILURE() << "expected a refusal";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("differ from the vision encoder's (16, 2, 2)"), std::string::npos)
        << e.what();
  }
  // Without a preprocessor_config.json the geometry is the encoder's.
  const auto fallback = gmod::make_image_preparer(other, s.dc.image, "", *s.tok);
  EXPECT_NE(fallback->describe().find("patch 16, merge 2"), std::string::npos) << fallback->describe();
}

// Videos take Qwen3-VL's own layout (timestamps per temporal step): tests/data/test_qwen3_vl_video.cpp.
TEST(Qwen3VlData, VideoPreparerIsQwen3Layout) {
  const QwenData s = qwen_data();
  const auto v = gmod::make_video_preparer(s.model, dir() + "/model", s.tok);
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->layout().family(), "Qwen3-VL");
}

// A system message that is set is written as chatml writes it; none by default (SamplesMatchTheProcessor).
TEST(Qwen3VlData, SetSystemMessageIsWritten) {
  QwenData s = qwen_data();
  s.dc.conversation.system_prompt = "Be brief.";
  gmod::Dataset ds(s.dc, s.tok);
  const gmod::PreparedSample p = ds.prepare(2);
  const auto want = s.tok->encode("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n");
  ASSERT_GE(p.sample.ids.size(), want.size());
  EXPECT_TRUE(std::equal(want.begin(), want.end(), p.sample.ids.begin()));
  const auto plain = reference()["records"][2]["input_ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(p.sample.ids.size(), plain.size() + want.size() - s.tok->encode("<|im_start|>user\n").size());
}

TEST(Qwen3VlData, SamplesMatchTheProcessor) {
  const QwenData s = qwen_data();
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
    for (const auto& a : r["answers"])
      for (int64_t t = a[0].get<int64_t>(); t < a[1].get<int64_t>(); ++t) labels[size_t(t)] = want[size_t(t)];
    EXPECT_EQ(p.sample.labels, labels) << r["id"];
    for (size_t t = 0; t < p.sample.ids.size(); ++t)
      EXPECT_EQ(p.sample.roles[t] == gmod::TokenRole::kImage, p.sample.ids[t] == s.model.image_token_id) << t;
    ASSERT_EQ(p.grids.size(), r["image_grid_thw"].size()) << r["id"];
    for (size_t i = 0; i < p.grids.size(); ++i)
      EXPECT_EQ(std::vector<int64_t>(p.grids[i].begin(), p.grids[i].end()),
                r["image_grid_thw"][i].get<std::vector<int64_t>>());
    samples.push_back(std::move(p));
  }
  gmod::Batch b = gmod::collate(samples, ds.encoder().pad_id(), ds.config().image.crop);
  ASSERT_TRUE(b.image_grid_thw.defined());
  const std::vector<int64_t> grids = {1, 12, 18, 1, 20, 10, 1, 12, 20};
  EXPECT_TRUE(b.image_grid_thw.flatten().equal(at::tensor(grids, at::kLong))) << b.image_grid_thw;
  int64_t row = 0;
  size_t off = 0;
  float worst = 0.0f;
  for (size_t k = 0; k < kRecords; ++k) {
    const auto& r = ref["records"][k];
    if (!r.contains("pixel_values")) continue;  // the text-only record
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
}

// The three records as one right-padded batch (M-RoPE ids from Batch::image_grid_thw, the tower and its DeepStack
// mergers on the concatenated patches) against each record run alone in Qwen3VLForConditionalGeneration: logits at
// every supervised position and the batch's loss within 1e-5, test_qwen3_vl.cpp's bounds.
TEST(Qwen3VlData, ModelOnTheBatchMatchesTransformers) {
  const QwenData s = qwen_data();
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
  double worst = 0;
  for (size_t k = 0; k < kRecords; ++k) {
    std::vector<int64_t> positions;
    for (const auto& a : r["records"][k]["answers"])
      for (int64_t t = a[0].get<int64_t>(); t < a[1].get<int64_t>(); ++t) positions.push_back(t);
    const at::Tensor ours = out.logits[int64_t(k)].index_select(0, at::tensor(positions, at::kLong));
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

// Packing (data.pack_to): the two image records laid end to end in one row through collate_packed give, through the
// model, the logits of the unpadded batch at every real token of each sample and the same loss, within 1e-5: each
// segment gets its own sample's 3-D ids, images and DeepStack features. The packed row's supervised logits are also
// checked against transformers' (each record alone).
TEST(Qwen3VlData, PackedImageSamplesMatchUnpacked) {
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
    const at::Tensor at_answers = packed.index_select(0, at::tensor(positions, at::kLong));
    worst_ref = std::max(worst_ref, (at_answers - theirs).abs().max().item<double>());
    start += n;
  }
  std::printf("packed vs unpacked logits: max abs %.3g; packed vs transformers %.3g; loss %.6f vs %.6f\n", worst,
              worst_ref, po.lm_loss.item<double>(), uo.lm_loss.item<double>());
  EXPECT_LT(worst, 1e-5);
  EXPECT_LT(worst_ref, 1e-5);
  EXPECT_EQ(po.supervised_tokens, uo.supervised_tokens);
  EXPECT_NEAR(po.lm_loss.item<double>(), uo.lm_loss.item<double>(), 1e-5);
}

}  // namespace test_qwen3_vl_data

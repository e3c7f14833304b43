// Qwen2.5-VL samples with videos through gmod's data pipeline (data/video_prep.h, Dataset, collate, pack) and the
// model, against transformers' Qwen2_5_VLProcessor and Qwen2_5_VLForConditionalGeneration
// (tests/fixtures/make_qwen2_5_vl_video_fixtures.py -> tests/fixtures/qwen2_5_vl/video/, the model and processor
// files of tests/fixtures/qwen2_5_vl/data/model): ids, supervised spans, grids and seconds per grid step exactly,
// pixel_values_videos within one uint8 step of the normalisation (the decoders' RGB rounding, test_video.cpp), logits
// and loss within test_hf_parity.cpp's 1e-5; bad videos are named bad records.
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
namespace test_qwen2_5_vl_video {
namespace {

std::string model_dir() { return fixture("qwen2_5_vl/data/model"); }
std::string dir() { return fixture("qwen2_5_vl/video"); }

nlohmann::json reference() {
  return gmod::test::read_reference(dir(), "tests/fixtures/make_qwen2_5_vl_video_fixtures.py");
}

using gmod::test::read_floats;

struct QwenData {
  std::shared_ptr<const gmod::Tokenizer> tok;
  gmod::LlavaConfig model;
  gmod::DatasetConfig dc;
};

// As the trainer sets it up (trainer/trainer.cpp setup_data): the model directory's processor files choose the image
// and video preparation; records name image/... and video/... under tests/fixtures.
QwenData qwen_data() {
  QwenData s;
  s.tok = gmod::load_tokenizer(model_dir());
  s.model = gmod::load_model_config(model_dir());
  s.dc.data_path = dir() + "/train.json";
  s.dc.image_folder = fixture("");
  s.dc.use_index_cache = false;  // never write next to the committed fixture
  s.dc.conversation.template_name = gmod::resolve_conversation_template("auto", s.model.text);
  s.dc.conversation.image_token_id = s.model.image_token_id;
  s.dc.conversation.image_seq_length = 1;
  s.dc.sample.max_len = 4096;
  s.dc.image_preparer = gmod::make_image_preparer(s.model, s.dc.image, model_dir(), *s.tok);
  s.dc.conversation.image_first = s.dc.image_preparer->image_first();
  s.dc.video_preparer = gmod::make_video_preparer(s.model, model_dir(), s.tok);
  return s;
}

std::vector<int64_t> flat(const nlohmann::json& grids) {
  std::vector<int64_t> out;
  for (const auto& g : grids)
    for (const auto& v : g) out.push_back(v.get<int64_t>());
  return out;
}

std::vector<int64_t> flat(const std::vector<std::array<int64_t, 3>>& grids) {
  std::vector<int64_t> out;
  for (const auto& g : grids) out.insert(out.end(), g.begin(), g.end());
  return out;
}

// Logits at each record's supervised positions against the reference's, the worst absolute difference.
double worst_answer_logits(const at::Tensor& logits, const nlohmann::json& ref, gmod::SafetensorsFile& tensors,
                           int64_t records) {
  double worst = 0;
  for (int64_t k = 0; k < records; ++k) {
    std::vector<int64_t> positions;
    for (const auto& a : ref["records"][size_t(k)]["answers"])
      for (int64_t t = a[0].get<int64_t>(); t < a[1].get<int64_t>(); ++t) positions.push_back(t);
    const at::Tensor ours = logits[k].index_select(0, at::tensor(positions, at::kLong));
    const at::Tensor theirs = tensors.tensor("record" + std::to_string(k) + ".answer_logits");
    EXPECT_EQ(ours.sizes(), theirs.sizes()) << "record " << k;
    if (ours.sizes() != theirs.sizes()) return 1e9;
    worst = std::max(worst, (ours - theirs).abs().max().item<double>());
  }
  return worst;
}

}  // namespace

TEST(Qwen25VlVideo, PreparerReadsTheVideoProcessorConfig) {
  const QwenData s = qwen_data();
  ASSERT_TRUE(s.dc.video_preparer);
  const gmod::VideoProcessorConfig& c = s.dc.video_preparer->config();
  // video_preprocessor_config.json wins over preprocessor_config.json (max_pixels 1024, no frame sampling).
  EXPECT_EQ(c.resolution.min_pixels, 64);
  EXPECT_EQ(c.resolution.max_pixels, 256);
  ASSERT_TRUE(c.sampling.fps.has_value());
  EXPECT_EQ(*c.sampling.fps, 4.0);
  EXPECT_EQ(c.sampling.min_frames, 2);
  EXPECT_EQ(c.sampling.max_frames, 16);
  // shapes.mp4: 20 frames at 10 fps, 64x48 -> 8 frames, 16x12 pixels, a 4x6x8 grid, 48 merged tokens, 0.5 s per step.
  const gmod::VideoPlan p = s.dc.video_preparer->plan(fixture("video/shapes.mp4"), gmod::kDefaultMaxImagePixels);
  EXPECT_EQ(p.indices.size(), 8u);
  EXPECT_EQ(flat(std::vector<std::array<int64_t, 3>>{p.grid_thw}), (std::vector<int64_t>{4, 6, 8}));
  EXPECT_EQ(p.tokens.count(), 48);
  EXPECT_EQ(p.tokens.ids.size(), 50u);
  EXPECT_EQ(p.tokens.id, s.model.mrope->video_token_id);
  EXPECT_EQ(p.tokens.ids.front(), *s.tok->token_to_id("<|vision_start|>"));
  EXPECT_DOUBLE_EQ(p.second_per_grid_ts, 0.5);
  // Without a video config the preprocessor_config.json's sizes hold and every frame is taken (transformers' default).
  const gmod::VideoProcessorConfig fallback = gmod::load_video_processor_config(model_dir() + "/preprocessor_config.json");
  EXPECT_EQ(fallback.resolution.max_pixels, 1024);
  EXPECT_FALSE(fallback.sampling.fps || fallback.sampling.num_frames);
}

TEST(Qwen25VlVideo, SamplesMatchTheProcessor) {
  const QwenData s = qwen_data();
  gmod::Dataset ds(s.dc, s.tok);
  const auto ref = reference();
  ASSERT_EQ(ref["records"].size(), 4u);
  const int32_t video_id = int32_t(s.model.mrope->video_token_id);
  for (size_t k = 0; k < 4; ++k) {
    const auto& r = ref["records"][k];
    const gmod::PreparedSample p = ds.prepare(k);
    const auto want = r["input_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(p.sample.ids, want) << r["id"];
    std::vector<int32_t> labels(want.size(), gmod::kIgnoreIndex);
    for (const auto& a : r["answers"])
      for (int64_t t = a[0].get<int64_t>(); t < a[1].get<int64_t>(); ++t) labels[size_t(t)] = want[size_t(t)];
    EXPECT_EQ(p.sample.labels, labels) << r["id"];
    // Visual positions (routable by MoD): the image and video pad ids, nothing else.
    for (size_t t = 0; t < p.sample.ids.size(); ++t)
      EXPECT_EQ(p.sample.roles[t] == gmod::TokenRole::kImage,
                p.sample.ids[t] == s.model.image_token_id || p.sample.ids[t] == video_id)
          << r["id"] << " position " << t;
    EXPECT_EQ(flat(p.grids), flat(r["image_grid_thw"])) << r["id"];
    EXPECT_EQ(flat(p.video_grids), flat(r["video_grid_thw"])) << r["id"];
    EXPECT_EQ(p.video_seconds, r["second_per_grid_ts"].get<std::vector<double>>()) << r["id"];
  }
}

// Collated: the video's patches, grid and step length in Batch; the patch values within one uint8 step of the
// normalisation, 1 / (255 * std) (test_video.cpp: swscale's RGB rounding may differ from PyAV's bundled FFmpeg).
TEST(Qwen25VlVideo, CollatedVideoMatchesTheProcessor) {
  const QwenData s = qwen_data();
  gmod::Dataset ds(s.dc, s.tok);
  const auto ref = reference();
  std::vector<gmod::PreparedSample> samples = {ds.prepare(0), ds.prepare(1), ds.prepare(2)};
  const gmod::Batch b = gmod::collate(samples, ds.encoder().pad_id(), ds.config().image.crop);
  ASSERT_TRUE(b.pixel_values_videos.defined());
  EXPECT_TRUE(b.video_grid_thw.flatten().equal(at::tensor(std::vector<int64_t>{4, 6, 8}, at::kLong)));
  EXPECT_TRUE(b.image_grid_thw.flatten().equal(at::tensor(flat(ref["records"][1]["image_grid_thw"]), at::kLong)));
  ASSERT_EQ(b.second_per_grid_ts.numel(), 1);
  EXPECT_EQ(b.second_per_grid_ts.item<float>(), 0.5f);
  const auto shape = ref["records"][0]["pixel_values_videos_shape"].get<std::vector<int64_t>>();
  ASSERT_EQ(b.pixel_values_videos.sizes(), at::IntArrayRef(shape));
  const auto want = read_floats(dir() + "/record0.pixel_values_videos.bin", size_t(shape[0] * shape[1]));
  const float* got = b.pixel_values_videos.data_ptr<float>();
  const auto& sd = s.dc.video_preparer->config().resolution.std;
  const float step = 1.0f / (255.0f * *std::min_element(sd.begin(), sd.end()));
  size_t off = 0;
  float worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const float d = std::abs(got[i] - want[i]);
    off += d > 1e-6f;
    worst = std::max(worst, d);
  }
  std::printf("pixel_values_videos: %zu of %zu values differ, worst %g (bound %g)\n", off, want.size(),
              double(worst), double(step + 1e-5f));
  EXPECT_LE(worst, step + 1e-5f);
  const gmod::ModelInputs in = gmod::to_model_inputs(b, at::kCPU);
  EXPECT_TRUE(in.pixel_values_videos.defined() && in.video_grid_thw.equal(b.video_grid_thw));
  EXPECT_TRUE(in.second_per_grid_ts.equal(b.second_per_grid_ts));
}

// The batch (video record, image record, text-only row, right-padded) drives the model as the processor's outputs drive
// transformers (each record alone): the encoder on the video, M-RoPE with the video's temporal ids (steps of
// tokens_per_second 3 x 0.5 s), logits at every supervised position and the batch's loss within 1e-5. The video's
// pixels are the processor's here (a decoder's rounding, bounded above, would otherwise move the logits); gmod's own
// decode is reported and bounded separately.
TEST(Qwen25VlVideo, ModelOnTheBatchMatchesTransformers) {
  const QwenData s = qwen_data();
  gmod::Dataset ds(s.dc, s.tok);
  const auto r = reference();
  std::vector<gmod::PreparedSample> samples = {ds.prepare(0), ds.prepare(1), ds.prepare(2)};
  gmod::Batch b = gmod::collate(samples, ds.encoder().pad_id(), ds.config().image.crop);
  auto model = gmod::load_pretrained(model_dir());
  model->eval();
  gmod::SafetensorsFile ref(dir() + "/reference.safetensors");
  at::NoGradGuard no_grad;
  const gmod::ModelOutput own = model->forward(gmod::to_model_inputs(b, at::kCPU));
  const auto shape = r["records"][0]["pixel_values_videos_shape"].get<std::vector<int64_t>>();
  const auto theirs = read_floats(dir() + "/record0.pixel_values_videos.bin", size_t(shape[0] * shape[1]));
  b.pixel_values_videos = at::tensor(theirs, at::kFloat).view({shape[0], shape[1]});
  const gmod::ModelOutput out = model->forward(gmod::to_model_inputs(b, at::kCPU));
  const double worst = worst_answer_logits(out.logits, r, ref, 3);
  const double worst_own = worst_answer_logits(own.logits, r, ref, 3);
  const double loss = out.lm_loss.item<double>(), want = ref.tensor("batch_loss").item<double>();
  std::printf("logits at %d supervised positions: max abs difference %.3g (with gmod's decoded video %.3g); loss "
              "%.9f vs %.9f (gmod's video %.9f)\n",
              int(out.supervised_tokens), worst, worst_own, loss, want, own.lm_loss.item<double>());
  EXPECT_LT(worst, 1e-5);
  EXPECT_NEAR(loss, want, 1e-5);
  EXPECT_LT(worst_own, 1e-2);  // one uint8 step in a few pixel values
}

// Packing (data.pack_to) with a video sample: the three samples in one row give the unpadded batch's loss, and the
// video record's supervised logits, within 1e-5: its segment keeps its own 3-D ids and its video.
TEST(Qwen25VlVideo, PackedVideoSamplesMatchUnpacked) {
  const QwenData s = qwen_data();
  gmod::Dataset ds(s.dc, s.tok);
  auto model = gmod::load_pretrained(model_dir());
  model->eval();
  at::NoGradGuard no_grad;
  std::vector<gmod::PreparedSample> a = {ds.prepare(0), ds.prepare(1), ds.prepare(2)};
  const gmod::Batch unpacked = gmod::collate(a, ds.encoder().pad_id(), ds.config().image.crop);
  std::vector<gmod::PreparedSample> c = {ds.prepare(0), ds.prepare(1), ds.prepare(2)};
  const gmod::Batch packed = gmod::collate_packed(c, ds.encoder().pad_id(), ds.config().image.crop, 4096);
  ASSERT_EQ(packed.input_ids.size(0), 1);
  ASSERT_TRUE(packed.video_grid_thw.defined());
  const gmod::ModelOutput u = model->forward(gmod::to_model_inputs(unpacked, at::kCPU));
  const gmod::ModelOutput p = model->forward(gmod::to_model_inputs(packed, at::kCPU));
  // Packing drops each segment's first label (no position predicts the next segment's first token); none of these
  // samples supervises its first token, so the supervised sets are the same.
  EXPECT_EQ(u.supervised_tokens, p.supervised_tokens);
  const double d = std::abs(u.lm_loss.item<double>() - p.lm_loss.item<double>());
  // The video record's segment: where collate_packed put it (row-major, in placement order).
  int64_t start = 0;
  for (size_t k = 0; k < packed.indices.size() && packed.indices[k] != 0; ++k) start += packed.segments->rows[0][k];
  const int64_t len = int64_t(ds.prepare(0, false).sample.ids.size());
  const double lg = (p.logits[0].narrow(0, start, len) - u.logits[0].narrow(0, 0, len)).abs().max().item<double>();
  std::printf("packed vs unpacked: loss %.3g apart, video segment's logits %.3g\n", d, lg);
  EXPECT_LT(d, 1e-5);
  EXPECT_LT(lg, 1e-5);
}

TEST(Qwen25VlVideo, BadVideosAreNamedBadRecords) {
  QwenData s = qwen_data();
  s.dc.data_path = dir() + "/bad.json";  // the video record, a missing video, a file that is not a video
  gmod::Dataset ds(s.dc, s.tok);
  ASSERT_EQ(ds.size(), 3u);
  gmod::PreparedSample good;
  gmod::BadRecord none;
  EXPECT_TRUE(ds.try_prepare(0, good, none)) << none.message;
  for (size_t i : {size_t(1), size_t(2)}) {
    for (bool decode : {true, false}) {  // gmod data check reads headers only: the same verdict
      gmod::PreparedSample p;
      gmod::BadRecord bad;
      EXPECT_FALSE(ds.try_prepare(i, p, bad, decode)) << i;
      EXPECT_EQ(bad.reason, "video") << bad.message;
      EXPECT_NE(bad.message.find("record " + std::to_string(i)), std::string::npos) << bad.message;
      EXPECT_NE(bad.message.find(i == 1 ? "no_such_clip.mp4" : "manifest.json"), std::string::npos) << bad.message;
    }
  }
  // A model that takes no video: a record with one is a bad record, not an error.
  QwenData no_video = qwen_data();
  no_video.dc.video_preparer = nullptr;
  gmod::Dataset plain(no_video.dc, no_video.tok);
  gmod::PreparedSample p;
  gmod::BadRecord bad;
  EXPECT_FALSE(plain.try_prepare(0, p, bad));
  EXPECT_EQ(bad.reason, "video");
  EXPECT_NE(bad.message.find("takes no video"), std::string::npos) << bad.message;
  EXPECT_TRUE(plain.try_prepare(1, p, bad)) << bad.message;
}

TEST(Qwen25VlVideo, VideoPlaceholdersMustMatchTheVideos) {
  const QwenData s = qwen_data();
  gmod::ConversationEncoder enc(s.tok, s.dc.conversation);
  gmod::Record r;
  r.id = "x";
  r.videos = {"video/shapes.mp4"};
  r.conversations = {{"human", "<video> and <video>?"}, {"gpt", "Two."}};
  const int32_t vid = int32_t(s.model.mrope->video_token_id);
  const gmod::VideoTokens span{{vid, vid}, vid};
  try {
    enc.encode(r, "f.json: record 3", {}, {span});
    ADD_FAILURE() << "expected a placeholder error";
  } catch (const gmod::SampleError& e) {
    EXPECT_EQ(e.reason(), "placeholder");
    EXPECT_NE(std::string(e.what()).find("2 <video> placeholder(s) but 1 video(s)"), std::string::npos) << e.what();
  }
}

}  // namespace test_qwen2_5_vl_video

// Qwen3-VL samples with videos through gmod's data pipeline (data/video_layout.h's Qwen3-VL layout, Dataset,
// collate, pack) and the model, against transformers' Qwen3VLProcessor and Qwen3VLForConditionalGeneration
// (tests/fixtures/make_qwen3_vl_video_fixtures.py -> tests/fixtures/qwen3_vl/video/, the model of
// tests/fixtures/qwen3_vl/data/model): ids with the "<t seconds>" text of every temporal step, supervised
// spans and grids exactly, the 3-D position ids of Qwen3VLModel.get_rope_index (per-frame video blocks)
// exactly, padded and packed; pixel_values_videos within one uint8 step of the normalisation (the decoders'
// RGB rounding, test_video.cpp); logits and loss within test_qwen3_vl_data.cpp's 1e-5, a video before an
// image included (DeepStack's joint order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/batch.h"
#include "data/dataset.h"
#include "data/pack.h"
#include "data/tokenizer.h"
#include "data/video_prep.h"
#include "model/config.h"
#include "model/llava.h"
#include "model/mrope.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "tests/common/fixture_io.h"
#include "tests/common/paths.h"

using gmod::test::fixture;

// A named namespace around the file keeps its helpers apart from other files in a unity build.
namespace test_qwen3_vl_video {
namespace {

std::string model_dir() { return fixture("qwen3_vl/data/model"); }
std::string dir() { return fixture("qwen3_vl/video"); }

nlohmann::json reference() {
  return gmod::test::read_reference(dir(), "tests/fixtures/make_qwen3_vl_video_fixtures.py");
}

struct QwenData {
  std::shared_ptr<const gmod::Tokenizer> tok;
  gmod::LlavaConfig model;
  gmod::DatasetConfig dc;
};

// As the trainer sets it up (trainer/trainer.cpp setup_data); records name image/... and video/... under
// tests/fixtures.
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

std::vector<int64_t> answer_positions(const nlohmann::json& record) {
  std::vector<int64_t> positions;
  for (const auto& a : record["answers"])
    for (int64_t t = a[0].get<int64_t>(); t < a[1].get<int64_t>(); ++t) positions.push_back(t);
  return positions;
}

// Logits of batch row `row` at record k's supervised positions against the reference's, the worst absolute
// difference.
double worst_answer_logits(const at::Tensor& logits, int64_t row, const nlohmann::json& ref,
                           gmod::SafetensorsFile& tensors, size_t k) {
  const at::Tensor ours =
      logits[row].index_select(0, at::tensor(answer_positions(ref["records"][k]), at::kLong));
  const at::Tensor theirs = tensors.tensor("record" + std::to_string(k) + ".answer_logits");
  EXPECT_EQ(ours.sizes(), theirs.sizes()) << "record " << k;
  if (ours.sizes() != theirs.sizes()) return 1e9;
  return (ours - theirs).abs().max().item<double>();
}

// The processor's video pixels in place of gmod's decode (a decoder's rounding would otherwise move the
// logits).
void use_reference_video(gmod::Batch& b, const nlohmann::json& ref, int copies) {
  const auto shape = ref["records"][0]["pixel_values_videos_shape"].get<std::vector<int64_t>>();
  const auto px =
      gmod::test::read_floats(dir() + "/record0.pixel_values_videos.bin", size_t(shape[0] * shape[1]));
  const at::Tensor one = at::tensor(px, at::kFloat).view({shape[0], shape[1]});
  b.pixel_values_videos = copies == 1 ? one : one.repeat({copies, 1});
}

}  // namespace

// The video processor's settings from video_preprocessor_config.json (Qwen3VLVideoProcessor's keys), its
// frame sampling (evenly spread, np.linspace rounded), its resize over all frames, and the timestamps' group
// means.
TEST(Qwen3VlVideo, PreparerFollowsQwen3VideoProcessor) {
  const QwenData s = qwen_data();
  ASSERT_TRUE(s.dc.video_preparer);
  EXPECT_EQ(s.dc.video_preparer->layout().family(), "Qwen3-VL");
  const gmod::VideoProcessorConfig& c = s.dc.video_preparer->config();
  EXPECT_EQ(c.resolution.min_pixels, 256);
  EXPECT_EQ(c.resolution.max_pixels, 1536);
  EXPECT_EQ(c.resolution.mean[0], 0.5f);
  ASSERT_TRUE(c.sampling.fps.has_value());
  EXPECT_EQ(*c.sampling.fps, 3.0);
  EXPECT_EQ(c.sampling.min_frames, 4);
  EXPECT_EQ(c.sampling.max_frames, 16);
  // shapes.mp4: 20 frames at 10 fps, 64x48 -> int(20 / 10 * 3) = 6 frames, linspace(0, 19, 6) rounded; 6
  // frames of 48x64 exceed 1536 pixels: beta = sqrt(6 * 48 * 64 / 1536) -> 12x16, grid 3x6x8, 12 tokens per
  // step.
  const gmod::VideoPlan p =
      s.dc.video_preparer->plan(fixture("video/shapes.mp4"), gmod::kDefaultMaxImagePixels);
  EXPECT_EQ(p.indices, (std::vector<int64_t>{0, 4, 8, 11, 15, 19}));
  EXPECT_EQ(flat(std::vector<std::array<int64_t, 3>>{p.grid_thw}), (std::vector<int64_t>{3, 6, 8}));
  EXPECT_EQ(p.tokens.count(), 36);
  // Steps at (0 + 0.4) / 2, (0.8 + 1.1) / 2 (0.9500000000000001: "1.0"), (1.5 + 1.9) / 2.
  const std::vector<double> t = gmod::video_step_timestamps(p.indices, p.info.fps, 2);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_DOUBLE_EQ(t[0], 0.2);
  EXPECT_DOUBLE_EQ(t[1], (0.8 + 1.1) / 2);
  EXPECT_DOUBLE_EQ(t[2], 1.7);
  // An odd frame count repeats the last index (Qwen3VLProcessor._calculate_timestamps).
  EXPECT_EQ(gmod::video_step_timestamps({0, 10, 20}, 10, 2), (std::vector<double>{0.5, 2.0}));
  // Sampling: num_frames as given, fps clamped to [min_frames, max_frames] and the video, no multiple of T.
  gmod::VideoSampling n5;
  n5.num_frames = 5;
  EXPECT_EQ(gmod::sample_frame_indices_uniform(20, 10, n5), (std::vector<int64_t>{0, 5, 10, 14, 19}));
  gmod::VideoSampling slow;
  slow.fps = 0.5;  // int(20 / 10 * 0.5) = 1 -> min_frames 4
  EXPECT_EQ(gmod::sample_frame_indices_uniform(20, 10, slow), (std::vector<int64_t>{0, 6, 13, 19}));
  n5.num_frames = 21;
  EXPECT_THROW(gmod::sample_frame_indices_uniform(20, 10, n5), std::invalid_argument);
  // The video resize compares all frames' pixels with the bounds: one frame of 48x64 fits 3072, two do not.
  EXPECT_EQ(gmod::smart_resize_video(2, 48, 64, 2, 4, 256, 6144), (std::array<int, 2>{48, 64}));
  EXPECT_EQ(gmod::smart_resize_video(4, 48, 64, 2, 4, 256, 6144), (std::array<int, 2>{32, 44}));
  EXPECT_THROW(gmod::smart_resize_video(1, 48, 64, 2, 4, 256, 6144), std::invalid_argument);
}

TEST(Qwen3VlVideo, SamplesMatchTheProcessor) {
  const QwenData s = qwen_data();
  gmod::Dataset ds(s.dc, s.tok);
  const auto ref = reference();
  ASSERT_EQ(ref["records"].size(), 4u);
  const int32_t video_id = int32_t(s.model.mrope->video_token_id);
  for (size_t k = 0; k < 4; ++k) {
    const auto& r = ref["records"][k];
    const gmod::PreparedSample p = ds.prepare(k);
    const auto want = r["input_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(p.sample.ids, want) << r["id"] << ": " << s.tok->decode(p.sample.ids);
    std::vector<int32_t> labels(want.size(), gmod::kIgnoreIndex);
    for (int64_t t : answer_positions(r)) labels[size_t(t)] = want[size_t(t)];
    EXPECT_EQ(p.sample.labels, labels) << r["id"];
    // Visual positions (routable by MoD): the image and video pad ids only, never the timestamps' text.
    for (size_t t = 0; t < p.sample.ids.size(); ++t)
      EXPECT_EQ(p.sample.roles[t] == gmod::TokenRole::kImage,
                p.sample.ids[t] == s.model.image_token_id || p.sample.ids[t] == video_id)
          << r["id"] << " position " << t;
    EXPECT_EQ(flat(p.grids), flat(r["image_grid_thw"])) << r["id"];
    EXPECT_EQ(flat(p.video_grids), flat(r["video_grid_thw"])) << r["id"];
    if (!r["timestamps"].empty()) {
      const std::string text = s.tok->decode(p.sample.ids);
      for (const auto& ts : r["timestamps"])
        EXPECT_NE(text.find(ts.get<std::string>()), std::string::npos) << ts << " in " << r["id"];
    }
  }
}

// Collated: the video's patches and grid in Batch, the values within one uint8 step of the normalisation,
// 1 / (255 * 0.5) (swscale's RGB rounding may differ from PyAV's bundled FFmpeg).
TEST(Qwen3VlVideo, CollatedVideoMatchesTheProcessor) {
  const QwenData s = qwen_data();
  gmod::Dataset ds(s.dc, s.tok);
  const auto ref = reference();
  std::vector<gmod::PreparedSample> samples = {ds.prepare(0), ds.prepare(1), ds.prepare(2)};
  const gmod::Batch b = gmod::collate(samples, ds.encoder().pad_id(), ds.config().image.crop);
  ASSERT_TRUE(b.pixel_values_videos.defined());
  EXPECT_TRUE(b.video_grid_thw.flatten().equal(at::tensor(std::vector<int64_t>{3, 6, 8}, at::kLong)));
  const auto shape = ref["records"][0]["pixel_values_videos_shape"].get<std::vector<int64_t>>();
  ASSERT_EQ(b.pixel_values_videos.sizes(), at::IntArrayRef(shape));
  const auto want =
      gmod::test::read_floats(dir() + "/record0.pixel_values_videos.bin", size_t(shape[0] * shape[1]));
  const float* got = b.pixel_values_videos.data_ptr<float>();
  const float step = 1.0f / (255.0f * 0.5f);
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
}

// M-RoPE ids of Qwen3VLModel.get_rope_index: each temporal step of a video is a (1, h, w) block after its
// timestamp's text. Each record alone, then all four right-padded in one batch (each row's real tokens keep
// their ids).
TEST(Qwen3VlVideo, PositionIdsMatchGetRopeIndex) {
  const QwenData s = qwen_data();
  gmod::Dataset ds(s.dc, s.tok);
  const auto ref = reference();
  std::vector<gmod::PreparedSample> all;
  for (size_t k = 0; k < 4; ++k) all.push_back(ds.prepare(k));
  for (size_t k = 0; k < 4; ++k) {
    std::vector<gmod::PreparedSample> one = {all[k]};
    const gmod::Batch b = gmod::collate(one, ds.encoder().pad_id(), ds.config().image.crop);
    const auto got = gmod::mrope_positions(b.input_ids, b.attention_mask, b.image_grid_thw, b.video_grid_thw,
                                           b.second_per_grid_ts, *s.model.mrope);
    const auto want = ref["records"][k]["position_ids"].get<std::vector<std::vector<int64_t>>>();
    for (int64_t a = 0; a < 3; ++a) {
      const auto row = got.positions[a][0].contiguous();
      EXPECT_EQ(std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel()),
                want[size_t(a)])
          << ref["records"][k]["id"] << " axis " << a;
    }
  }
  const gmod::Batch b = gmod::collate(all, ds.encoder().pad_id(), ds.config().image.crop);
  const auto got = gmod::mrope_positions(b.input_ids, b.attention_mask, b.image_grid_thw, b.video_grid_thw,
                                         b.second_per_grid_ts, *s.model.mrope);
  for (size_t k = 0; k < 4; ++k) {
    const auto want = ref["records"][k]["position_ids"].get<std::vector<std::vector<int64_t>>>();
    const int64_t n = int64_t(want[0].size());
    for (int64_t a = 0; a < 3; ++a) {
      const auto row = got.positions[a][int64_t(k)].narrow(0, 0, n).contiguous();
      EXPECT_EQ(std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + n), want[size_t(a)])
          << "padded batch, " << ref["records"][k]["id"] << " axis " << a;
    }
  }
}

// The batch (video record, image record, text-only row, right-padded) drives the model as the processor's
// outputs drive transformers (each record alone): logits at every supervised position and the batch's loss
// within 1e-5; then the video record alone (no images in the batch) and the record with a video before an
// image, whose DeepStack features go in sequence order (video, then image) while the encoder gives the
// image's first.
TEST(Qwen3VlVideo, ModelOnTheBatchMatchesTransformers) {
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
  use_reference_video(b, r, 1);
  const gmod::ModelOutput out = model->forward(gmod::to_model_inputs(b, at::kCPU));
  double worst = 0, worst_own = 0;
  for (size_t k = 0; k < 3; ++k) {
    worst = std::max(worst, worst_answer_logits(out.logits, int64_t(k), r, ref, k));
    worst_own = std::max(worst_own, worst_answer_logits(own.logits, int64_t(k), r, ref, k));
  }
  const double loss = out.lm_loss.item<double>(), want = ref.tensor("batch_loss").item<double>();
  std::printf(
      "logits at %d supervised positions: max abs difference %.3g (with gmod's decoded video %.3g); loss "
      "%.9f vs %.9f (gmod's video %.9f)\n",
      int(out.supervised_tokens), worst, worst_own, loss, want, own.lm_loss.item<double>());
  EXPECT_LT(worst, 1e-5);
  EXPECT_NEAR(loss, want, 1e-5);
  EXPECT_LT(worst_own, 1e-2);  // one uint8 step in a few pixel values

  // The video record alone: a batch without images (the encoder on the video only, its DeepStack rows all
  // video).
  std::vector<gmod::PreparedSample> video_only = {ds.prepare(0)};
  gmod::Batch v = gmod::collate(video_only, ds.encoder().pad_id(), ds.config().image.crop);
  ASSERT_FALSE(v.pixel_values.defined() && v.pixel_values.size(0) > 0);
  use_reference_video(v, r, 1);
  const double worst_video =
      worst_answer_logits(model->forward(gmod::to_model_inputs(v, at::kCPU)).logits, 0, r, ref, 0);
  std::printf("video record alone: max abs difference %.3g\n", worst_video);
  EXPECT_LT(worst_video, 1e-5);

  std::vector<gmod::PreparedSample> mixed = {ds.prepare(3)};
  gmod::Batch m = gmod::collate(mixed, ds.encoder().pad_id(), ds.config().image.crop);
  ASSERT_TRUE(m.pixel_values.defined() && m.pixel_values_videos.defined());
  use_reference_video(m, r, 1);
  const gmod::ModelOutput mo = model->forward(gmod::to_model_inputs(m, at::kCPU));
  const double worst_mixed = worst_answer_logits(mo.logits, 0, r, ref, 3);
  std::printf(
      "video then image (DeepStack order): logits at %d supervised positions, max abs difference %.3g\n",
      int(mo.supervised_tokens), worst_mixed);
  EXPECT_LT(worst_mixed, 1e-5);
}

// Packing (data.pack_to) with video samples: the four samples in one row give the unpadded batch's loss, and
// each video record's supervised logits, within 1e-5: its segment keeps its own per-frame 3-D ids, video and
// DeepStack rows.
TEST(Qwen3VlVideo, PackedVideoSamplesMatchUnpacked) {
  const QwenData s = qwen_data();
  gmod::Dataset ds(s.dc, s.tok);
  auto model = gmod::load_pretrained(model_dir());
  model->eval();
  at::NoGradGuard no_grad;
  std::vector<gmod::PreparedSample> a = {ds.prepare(0), ds.prepare(1), ds.prepare(2), ds.prepare(3)};
  const gmod::Batch unpacked = gmod::collate(a, ds.encoder().pad_id(), ds.config().image.crop);
  std::vector<gmod::PreparedSample> c = {ds.prepare(0), ds.prepare(1), ds.prepare(2), ds.prepare(3)};
  const gmod::Batch packed = gmod::collate_packed(c, ds.encoder().pad_id(), ds.config().image.crop, 4096);
  ASSERT_EQ(packed.input_ids.size(0), 1);
  ASSERT_TRUE(packed.video_grid_thw.defined());
  const gmod::ModelOutput u = model->forward(gmod::to_model_inputs(unpacked, at::kCPU));
  const gmod::ModelOutput p = model->forward(gmod::to_model_inputs(packed, at::kCPU));
  EXPECT_EQ(u.supervised_tokens, p.supervised_tokens);
  const double d = std::abs(u.lm_loss.item<double>() - p.lm_loss.item<double>());
  double lg = 0;
  for (int64_t rec :
       {int64_t(0), int64_t(3)}) {  // the video records' segments, where collate_packed put them
    int64_t start = 0;
    for (size_t k = 0; k < packed.indices.size() && int64_t(packed.indices[k]) != rec; ++k)
      start += packed.segments->rows[0][k];
    const int64_t len = int64_t(a[size_t(rec)].sample.ids.size());
    lg = std::max(
        lg, (p.logits[0].narrow(0, start, len) - u.logits[rec].narrow(0, 0, len)).abs().max().item<double>());
  }
  std::printf("packed vs unpacked: loss %.3g apart, the video segments' logits %.3g\n", d, lg);
  EXPECT_LT(d, 1e-5);
  EXPECT_LT(lg, 1e-5);
}

TEST(Qwen3VlVideo, BadVideosAreNamedBadRecords) {
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
      EXPECT_NE(bad.message.find(i == 1 ? "no_such_clip.mp4" : "manifest.json"), std::string::npos)
          << bad.message;
    }
  }
}

}  // namespace test_qwen3_vl_video

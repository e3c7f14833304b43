// Video decoding (FFmpeg) and Qwen2-VL video preprocessing against transformers' Qwen2VLVideoProcessor with its
// PyAV loader (tests/fixtures/make_video_fixtures.py -> tests/fixtures/video/), and bad input.
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

#include "data/native_resolution.h"
#include "data/video.h"
#include "tests/common/paths.h"

using gmod::test::fixture;

namespace {

// Tolerances. Frames: our FFmpeg (Debian 12's libavcodec 59 / libswscale 6) and PyAV's bundled one (libavcodec 61 /
// libswscale 8) decode MPEG-4 Part 2 to the same YUV, but swscale's YUV -> RGB24 conversion may round differently
// between versions and SIMD paths: each RGB value within kRgbTol (1/255 after rescaling). Patches: a frame value off
// by one can move the bicubic resize by one as well, so a patch value may differ by one uint8 step of the
// normalisation, 1 / (255 * std) <= 0.0146; measured values are printed.
constexpr int kRgbTol = 1;

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
  std::ifstream f(fixture("video/manifest.json"));
  EXPECT_TRUE(f.good()) << "missing manifest (run tests/fixtures/make_video_fixtures.py)";
  nlohmann::json j;
  f >> j;
  return j;
}

std::string video_path() { return fixture("video/shapes.mp4"); }

gmod::VideoSampling sampling(const nlohmann::json& kwargs) {
  gmod::VideoSampling s;
  if (kwargs.contains("fps")) s.fps = kwargs["fps"].get<double>();
  if (kwargs.contains("num_frames")) s.num_frames = kwargs["num_frames"].get<int>();
  return s;
}

// Expects `fn` to throw E whose message names `name` and contains `what`.
template <typename E, typename F>
void expect_named_error(F fn, const std::string& name, const std::string& what) {
  try {
    fn();
    ADD_FAILURE() << "no error for " << name;
  } catch (const E& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(name), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

}  // namespace

TEST(Video, ProbeReadsTheHeaderPyAvReads) {
  const auto m = manifest();
  const auto info = gmod::probe_video_file(video_path());
  EXPECT_EQ(info.width, m["width"].get<int>());
  EXPECT_EQ(info.height, m["height"].get<int>());
  EXPECT_EQ(info.total_frames, m["total_num_frames"].get<int64_t>());
  EXPECT_DOUBLE_EQ(info.fps, m["fps"].get<double>());
  EXPECT_EQ(info.codec, "mpeg4");
}

TEST(Video, FrameIndicesMatchTransformers) {
  const auto m = manifest();
  ASSERT_EQ(m["cases"].size(), 5u);
  const auto cfg = gmod::load_native_resolution_config(fixture("video"));
  for (const auto& c : m["cases"]) {
    const auto idx = gmod::sample_frame_indices(m["total_num_frames"], m["fps"], sampling(c["kwargs"]),
                                                cfg.temporal_patch_size);
    EXPECT_EQ(idx, c["indices"].get<std::vector<int64_t>>()) << c["name"];
  }
  // Lengths and rates beyond the clip: long videos, fractional rates, min_frames / max_frames, and requests larger
  // than the video (an error in both).
  ASSERT_EQ(m["sampling"].size(), 72u);
  for (const auto& c : m["sampling"]) {
    gmod::VideoSampling s = sampling(c["kwargs"]);
    if (c["kwargs"].contains("min_frames")) s.min_frames = c["kwargs"]["min_frames"];
    if (c["kwargs"].contains("max_frames")) s.max_frames = c["kwargs"]["max_frames"];
    if (c.contains("error")) {
      EXPECT_THROW(gmod::sample_frame_indices(c["total"], c["video_fps"], s, cfg.temporal_patch_size),
                   std::invalid_argument)
          << c.dump();
      continue;
    }
    EXPECT_EQ(gmod::sample_frame_indices(c["total"], c["video_fps"], s, cfg.temporal_patch_size),
              c["indices"].get<std::vector<int64_t>>())
        << c["total"] << " " << c["kwargs"].dump();
  }
  gmod::VideoSampling both;
  both.fps = 2;
  both.num_frames = 4;
  EXPECT_THROW(gmod::sample_frame_indices(20, 10, both, 2), std::invalid_argument);
  gmod::VideoSampling too_many;
  too_many.num_frames = 22;
  EXPECT_THROW(gmod::sample_frame_indices(20, 10, too_many, 2), std::invalid_argument);
  gmod::VideoSampling by_fps;
  by_fps.fps = 2;
  EXPECT_THROW(gmod::sample_frame_indices(20, 0, by_fps, 2), std::invalid_argument);
}

TEST(Video, FramesMatchPyAv) {
  const auto m = manifest();
  const int n = m["total_num_frames"], h = m["height"], w = m["width"];
  std::vector<int64_t> all(n);
  for (int i = 0; i < n; ++i) all[i] = i;
  const auto frames = gmod::decode_video_frames(video_path(), all);
  ASSERT_EQ(frames.size(), size_t(n));
  const auto ref = read_raw<uint8_t>(fixture("video/" + m["frames_rgb"].get<std::string>()), size_t(n) * h * w * 3);
  size_t off = 0;
  int worst = 0;
  for (int f = 0; f < n; ++f) {
    ASSERT_EQ(frames[f].width, w);
    ASSERT_EQ(frames[f].height, h);
    for (size_t i = 0; i < frames[f].rgb.size(); ++i) {
      const int d = std::abs(int(frames[f].rgb[i]) - int(ref[size_t(f) * h * w * 3 + i]));
      off += d != 0;
      worst = std::max(worst, d);
    }
  }
  std::printf("decoded frames: %zu of %zu RGB values differ from PyAV, worst %d\n", off, ref.size(), worst);
  EXPECT_LE(worst, kRgbTol);
  // A subset decodes to the same frames as the full pass.
  const auto some = gmod::decode_video_frames(video_path(), {3, 4, 19});
  ASSERT_EQ(some.size(), 3u);
  EXPECT_EQ(some[0].rgb, frames[3].rgb);
  EXPECT_EQ(some[2].rgb, frames[19].rgb);
}

// H.264 with B-frames: the decoder returns frames in display order, not packet order; index i is the i-th frame
// out of the decoder, as in PyAV's loop.
TEST(Video, H264WithBFramesMatchesPyAv) {
  const auto m = manifest()["h264"];
  const std::string path = fixture("video/" + m["file"].get<std::string>());
  const auto info = gmod::probe_video_file(path);
  EXPECT_EQ(info.codec, "h264");
  EXPECT_EQ(info.total_frames, m["total_num_frames"].get<int64_t>());
  EXPECT_DOUBLE_EQ(info.fps, m["fps"].get<double>());
  const int n = static_cast<int>(info.total_frames), h = info.height, w = info.width;
  std::vector<int64_t> all(n);
  for (int i = 0; i < n; ++i) all[i] = i;
  const auto frames = gmod::decode_video_frames(path, all);
  ASSERT_EQ(frames.size(), size_t(n));
  const auto ref = read_raw<uint8_t>(fixture("video/" + m["frames_rgb"].get<std::string>()), size_t(n) * h * w * 3);
  size_t off = 0;
  int worst = 0;
  for (int f = 0; f < n; ++f)
    for (size_t i = 0; i < frames[f].rgb.size(); ++i) {
      const int d = std::abs(int(frames[f].rgb[i]) - int(ref[size_t(f) * h * w * 3 + i]));
      off += d != 0;
      worst = std::max(worst, d);
    }
  std::printf("h264 frames: %zu of %zu RGB values differ from PyAV, worst %d\n", off, ref.size(), worst);
  EXPECT_LE(worst, kRgbTol);
  const auto some = gmod::decode_video_frames(path, {0, 2, 5, 7, 10, 12, 15, 17});
  ASSERT_EQ(some.size(), 8u);
  EXPECT_EQ(some[3].rgb, frames[7].rgb);
  EXPECT_EQ(some[7].rgb, frames[17].rgb);
}

TEST(Video, PatchesMatchTransformers) {
  const auto m = manifest();
  const auto cfg = gmod::load_native_resolution_config(fixture("video"));
  const float step = 1.0f / (255.0f * *std::min_element(cfg.std.begin(), cfg.std.end()));
  for (const auto& c : m["cases"]) {
    const auto v = gmod::preprocess_native_video(video_path(), cfg, sampling(c["kwargs"]));
    const auto& g = c["grid_thw"];
    for (int k = 0; k < 3; ++k) EXPECT_EQ(v.patches.grid_thw[k], g[k].get<int64_t>()) << c["name"];
    EXPECT_EQ(v.indices, c["indices"].get<std::vector<int64_t>>()) << c["name"];
    EXPECT_DOUBLE_EQ(v.second_per_grid_ts, c["second_per_grid_ts"].get<double>()) << c["name"];
    ASSERT_EQ(v.patches.rows(), c["rows"].get<int64_t>()) << c["name"];
    ASSERT_EQ(v.patches.row_size, c["row_size"].get<int64_t>()) << c["name"];
    if (!c.contains("patches")) continue;
    const auto ref = read_raw<float>(fixture("video/" + c["patches"].get<std::string>()),
                                     size_t(v.patches.rows() * v.patches.row_size));
    size_t off = 0;
    float worst = 0.0f;
    for (size_t i = 0; i < ref.size(); ++i) {
      const float d = std::abs(v.patches.pixel_values[i] - ref[i]);
      off += d > 1e-6f;
      worst = std::max(worst, d);
    }
    std::printf("%s: %zu of %zu patch values differ, worst %g\n", c["name"].get<std::string>().c_str(), off,
                ref.size(), double(worst));
    EXPECT_LE(worst, step + 1e-5f) << c["name"];
  }
}

TEST(Video, BadInputGivesNamedErrors) {
  gmod::test::TempDir tmp;
  const std::string missing = tmp.str("missing.mp4");
  expect_named_error<std::runtime_error>([&] { gmod::probe_video_file(missing); }, missing, "no such file");
  expect_named_error<std::runtime_error>([&] { gmod::decode_video_frames(missing, {0}); }, missing, "no such file");

  // Not a video: a PNG and a text file.
  const std::string png = fixture("image/tiny.png");
  expect_named_error<std::runtime_error>([&] { gmod::decode_video_frames(png, {0, 1}); }, png, "video");
  const std::string text = tmp.str("notes.mp4");
  std::ofstream(text) << "these are not the frames you are looking for\n";
  expect_named_error<std::runtime_error>([&] { gmod::probe_video_file(text); }, text, "not a video");
  const std::string empty = tmp.str("empty.mp4");
  std::ofstream(empty).close();
  expect_named_error<std::runtime_error>([&] { gmod::probe_video_file(empty); }, empty, "empty");

  // Truncated: the header (moov first) survives, the frame data ends early.
  const auto bytes = read_bytes(video_path());
  const std::string cut = tmp.str("cut.mp4");
  {
    std::ofstream f(cut, std::ios::binary);
    f.write(bytes.data(), std::streamsize(bytes.size() * 6 / 10));
  }
  const auto cfg = gmod::load_native_resolution_config(fixture("video"));
  expect_named_error<std::runtime_error>([&] { gmod::preprocess_native_video(cut, cfg); }, cut, "truncated");
  // Cut inside the header: not readable at all.
  const std::string head = tmp.str("head.mp4");
  {
    std::ofstream f(head, std::ios::binary);
    f.write(bytes.data(), 40);
  }
  EXPECT_THROW(gmod::preprocess_native_video(head, cfg), std::runtime_error);
}

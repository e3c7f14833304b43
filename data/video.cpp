// Video decoding with FFmpeg, Qwen2-VL's and Qwen3-VL's frame sampling and sizes. See video.h.
#include "data/video.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <sys/stat.h>

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/avutil.h>
#include <libavutil/error.h>
#include <libavutil/log.h>
#include <libswscale/swscale.h>
}

namespace gmod {
namespace {

std::string av_error(int code) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(code, buf, sizeof(buf));
  return buf;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

struct FormatCloser {
  void operator()(AVFormatContext* f) const { avformat_close_input(&f); }
};
struct CodecCloser {
  void operator()(AVCodecContext* c) const { avcodec_free_context(&c); }
};
struct PacketFree {
  void operator()(AVPacket* p) const { av_packet_free(&p); }
};
struct FrameFree {
  void operator()(AVFrame* f) const { av_frame_free(&f); }
};
struct SwsFree {
  void operator()(SwsContext* s) const { sws_freeContext(s); }
};

// An opened container with its first video stream.
struct OpenVideo {
  std::unique_ptr<AVFormatContext, FormatCloser> fmt;
  AVStream* stream = nullptr;
  const AVCodec* codec = nullptr;
  VideoInfo info;
};

OpenVideo open_video(const std::string& path, int64_t max_pixels) {
  static std::once_flag quiet;
  std::call_once(quiet, [] { av_log_set_level(AV_LOG_FATAL); });  // errors become exceptions naming the file
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(path, "cannot open video: no such file");
  if (!S_ISREG(st.st_mode)) fail(path, "cannot open video: not a regular file");
  if (st.st_size == 0) fail(path, "cannot open video: the file is empty");
  OpenVideo v;
  AVFormatContext* raw = nullptr;
  int rc = avformat_open_input(&raw, path.c_str(), nullptr, nullptr);
  if (rc < 0) fail(path, "not a video FFmpeg can read (" + av_error(rc) + ")");
  v.fmt.reset(raw);
  rc = avformat_find_stream_info(raw, nullptr);
  if (rc < 0) fail(path, "cannot read the stream information (" + av_error(rc) + ")");
  const int idx = av_find_best_stream(raw, AVMEDIA_TYPE_VIDEO, -1, -1, &v.codec, 0);
  if (idx == AVERROR_STREAM_NOT_FOUND) fail(path, "has no video stream");
  if (idx < 0 || v.codec == nullptr) fail(path, "no decoder for its video stream (" + av_error(idx) + ")");
  v.stream = raw->streams[idx];
  const AVCodecParameters* par = v.stream->codecpar;
  v.info.width = par->width;
  v.info.height = par->height;
  v.info.codec = v.codec->name;
  if (v.info.width <= 0 || v.info.height <= 0)
    fail(path, "video stream has no frame size (" + std::to_string(v.info.width) + "x" +
                   std::to_string(v.info.height) + ")");
  if (int64_t(v.info.width) * v.info.height > max_pixels)
    fail(path, "video frames of " + std::to_string(v.info.width) + "x" + std::to_string(v.info.height) +
                   " exceed the limit of " + std::to_string(max_pixels) + " pixels");
  const AVRational rate = v.stream->avg_frame_rate;
  v.info.fps = rate.num > 0 && rate.den > 0 ? av_q2d(rate) : 0.0;
  v.info.total_frames = v.stream->nb_frames;
  return v;
}

// Counts the video stream's packets (one per frame for the codecs without B-frame reordering tricks) when the
// header has no frame count, then rewinds.
int64_t count_frames(const std::string& path, OpenVideo& v) {
  std::unique_ptr<AVPacket, PacketFree> pkt(av_packet_alloc());
  int64_t n = 0;
  int rc;
  while ((rc = av_read_frame(v.fmt.get(), pkt.get())) >= 0) {
    n += pkt->stream_index == v.stream->index;
    av_packet_unref(pkt.get());
  }
  if (rc != AVERROR_EOF) fail(path, "cannot read the video while counting its frames (" + av_error(rc) + ")");
  if (av_seek_frame(v.fmt.get(), v.stream->index, 0, AVSEEK_FLAG_BACKWARD) < 0)
    fail(path, "cannot rewind the video after counting its frames");
  return n;
}

Image to_rgb(const std::string& path, const AVFrame* f, const VideoInfo& info, SwsContext*& sws_cache) {
  if (f->width != info.width || f->height != info.height)
    fail(path, "a frame of " + std::to_string(f->width) + "x" + std::to_string(f->height) +
                   " in a video of " + std::to_string(info.width) + "x" + std::to_string(info.height));
  // PyAV's reformat: a cached context, SWS_BILINEAR, no colour-space override when source and target agree.
  sws_cache = sws_getCachedContext(sws_cache, f->width, f->height, static_cast<AVPixelFormat>(f->format), f->width,
                                   f->height, AV_PIX_FMT_RGB24, SWS_BILINEAR, nullptr, nullptr, nullptr);
  if (sws_cache == nullptr) fail(path, "cannot convert the decoded frames to RGB");
  Image img;
  img.width = f->width;
  img.height = f->height;
  img.rgb.resize(static_cast<size_t>(img.width) * img.height * 3);
  uint8_t* dst[4] = {img.rgb.data(), nullptr, nullptr, nullptr};
  int stride[4] = {img.width * 3, 0, 0, 0};
  const int rows = sws_scale(sws_cache, f->data, f->linesize, 0, f->height, dst, stride);
  if (rows != f->height)
    fail(path, "swscale converted " + std::to_string(rows) + " of " + std::to_string(f->height) + " rows");
  return img;
}

}  // namespace

VideoInfo probe_video_file(const std::string& path, int64_t max_pixels) {
  OpenVideo v = open_video(path, max_pixels);
  if (v.info.total_frames <= 0) v.info.total_frames = count_frames(path, v);
  return v.info;
}

std::vector<int64_t> sample_frame_indices(int64_t total_frames, double video_fps, const VideoSampling& s,
                                          int temporal_patch_size) {
  const int T = temporal_patch_size;
  if (T <= 0) throw std::invalid_argument("sample_frame_indices: temporal_patch_size must be positive");
  if (total_frames <= 0) throw std::invalid_argument("sample_frame_indices: the video has no frames");
  if (s.fps && s.num_frames) throw std::invalid_argument("sample_frame_indices: give fps or num_frames, not both");
  double n = static_cast<double>(total_frames);  // neither: every frame
  if (s.num_frames) {
    n = std::nearbyint(static_cast<double>(*s.num_frames) / T) * T;  // Python round(): half to even
  } else if (s.fps) {
    if (!(video_fps > 0))
      throw std::invalid_argument("sample_frame_indices: sampling by fps needs the video's frame rate");
    const double max_frames = std::floor(static_cast<double>(std::min<int64_t>(s.max_frames, total_frames)) / T) * T;
    double want = static_cast<double>(total_frames) / video_fps * *s.fps;
    want = std::min({std::max(want, static_cast<double>(s.min_frames)), max_frames, static_cast<double>(total_frames)});
    n = std::floor(want / T) * T;
  }
  if (n > static_cast<double>(total_frames))
    throw std::invalid_argument("sample_frame_indices: " + std::to_string(static_cast<int64_t>(n)) +
                                " frames asked of a video of " + std::to_string(total_frames));
  if (n <= 0) throw std::invalid_argument("sample_frame_indices: no frames to sample (frame count rounds to 0)");
  const double step = static_cast<double>(total_frames) / n;
  const int64_t count = static_cast<int64_t>(std::ceil(static_cast<double>(total_frames) / step));
  // torch.arange(0, total, step) in float32 as ATen's CPU kernel fills it (the same on every instruction set: 3000
  // random (total, n) agreed under AVX-512, AVX2 and the default kernels): blocks of 2 x 8 values as two vectors,
  // each vector from its first value rounded to float, base + k * step in double, then rounded; the remaining
  // count % 16 values one by one, float(i * step). Then .int() truncates.
  constexpr int64_t kVec = 8;
  const int64_t vectorised = count / (2 * kVec) * (2 * kVec);
  std::vector<int64_t> idx(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    float v;
    if (i < vectorised) {
      const int64_t first = i / kVec * kVec;
      const float base = static_cast<float>(step * static_cast<double>(first));
      v = static_cast<float>(static_cast<double>(base) + static_cast<double>(i - first) * step);
    } else {
      v = static_cast<float>(step * static_cast<double>(i));
    }
    idx[static_cast<size_t>(i)] = static_cast<int64_t>(v);
  }
  return idx;
}

std::vector<int64_t> sample_frame_indices_uniform(int64_t total_frames, double video_fps,
                                                  const VideoSampling& s) {
  if (total_frames <= 0) throw std::invalid_argument("sample_frame_indices: the video has no frames");
  if (s.fps && s.num_frames)
    throw std::invalid_argument("sample_frame_indices: give fps or num_frames, not both");
  int64_t n = total_frames;
  if (s.num_frames) {
    n = *s.num_frames;
  } else if (s.fps) {
    const double rate = video_fps > 0 ? video_fps : 24.0;
    n = static_cast<int64_t>(static_cast<double>(total_frames) / rate * *s.fps);  // Python int(): truncation
    n = std::min({std::max<int64_t>(n, s.min_frames), int64_t{s.max_frames}, total_frames});
  }
  if (n <= 0) throw std::invalid_argument("sample_frame_indices: no frames to sample");
  if (n > total_frames)
    throw std::invalid_argument("sample_frame_indices: " + std::to_string(n) +
                                " frames asked of a video of " + std::to_string(total_frames));
  // np.linspace: start + i * step in double, the last value exactly the stop; np.round: halves to even.
  std::vector<int64_t> idx(static_cast<size_t>(n));
  const double stop = static_cast<double>(total_frames - 1),
               step = n > 1 ? stop / static_cast<double>(n - 1) : 0.0;
  for (int64_t i = 0; i < n; ++i)
    idx[static_cast<size_t>(i)] =
        static_cast<int64_t>(std::nearbyint(i == n - 1 && n > 1 ? stop : static_cast<double>(i) * step));
  return idx;
}

std::array<int, 2> smart_resize_video(int64_t frames, int height, int width, int temporal_factor, int factor,
                                      int64_t min_pixels, int64_t max_pixels) {
  if (frames < temporal_factor)
    throw std::invalid_argument("smart_resize: " + std::to_string(frames) +
                                " frames, fewer than temporal_patch_size " + std::to_string(temporal_factor));
  if (height <= 0 || width <= 0 || factor <= 0 || temporal_factor <= 0)
    throw std::invalid_argument("smart_resize: height, width and factors must be positive, got " +
                                std::to_string(height) + "x" + std::to_string(width));
  if (height < factor || width < factor) {
    const double scale = std::max(static_cast<double>(factor) / height, static_cast<double>(factor) / width);
    height = static_cast<int>(height * scale);
    width = static_cast<int>(width * scale);
  }
  const double ratio = static_cast<double>(std::max(height, width)) / std::min(height, width);
  if (ratio > 200)
    throw std::invalid_argument("smart_resize: aspect ratio must be at most 200, got " +
                                std::to_string(ratio));
  int64_t h_bar = static_cast<int64_t>(std::nearbyint(static_cast<double>(height) / factor)) * factor;
  int64_t w_bar = static_cast<int64_t>(std::nearbyint(static_cast<double>(width) / factor)) * factor;
  const int64_t t_bar =
      static_cast<int64_t>(std::nearbyint(static_cast<double>(frames) / temporal_factor)) * temporal_factor;
  const double volume = static_cast<double>(frames) * height * width;
  if (t_bar * h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt(volume / static_cast<double>(max_pixels));
    h_bar = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(height / beta / factor)) * factor);
    w_bar = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(width / beta / factor)) * factor);
  } else if (t_bar * h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / volume);
    h_bar = static_cast<int64_t>(std::ceil(height * beta / factor)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(width * beta / factor)) * factor;
  }
  return {static_cast<int>(h_bar), static_cast<int>(w_bar)};
}

namespace {

// decode_video_frames; a non-empty `resize_to` {height, width} resizes each frame as soon as it is converted, so a
// long high-resolution video never holds more than one full-size frame.
std::vector<Image> decode_frames(const std::string& path, const std::vector<int64_t>& indices, int64_t max_pixels,
                                 std::optional<std::array<int, 2>> resize_to) {
  if (indices.empty()) return {};
  for (size_t i = 0; i < indices.size(); ++i)
    if (indices[i] < 0 || (i > 0 && indices[i] <= indices[i - 1]))
      throw std::invalid_argument(path + ": frame indices must be ascending and non-negative");
  OpenVideo v = open_video(path, max_pixels);
  std::unique_ptr<AVCodecContext, CodecCloser> ctx(avcodec_alloc_context3(v.codec));
  if (!ctx) fail(path, "cannot allocate a decoder");
  int rc = avcodec_parameters_to_context(ctx.get(), v.stream->codecpar);
  if (rc < 0) fail(path, "cannot set up the " + v.info.codec + " decoder (" + av_error(rc) + ")");
  ctx->thread_count = 1;  // frames in order, no worker threads per video (data-loader threads already run in parallel)
  rc = avcodec_open2(ctx.get(), v.codec, nullptr);
  if (rc < 0) fail(path, "cannot open the " + v.info.codec + " decoder (" + av_error(rc) + ")");

  std::unique_ptr<AVPacket, PacketFree> pkt(av_packet_alloc());
  std::unique_ptr<AVFrame, FrameFree> frame(av_frame_alloc());
  SwsContext* sws_raw = nullptr;
  std::vector<Image> out;
  out.reserve(indices.size());
  int64_t decoded = 0;
  size_t next = 0;
  bool ok = false;
  try {
    // Receives every frame the decoder has ready; true once the last wanted index has been converted.
    const auto drain = [&]() {
      while (true) {
        const int r = avcodec_receive_frame(ctx.get(), frame.get());
        if (r == AVERROR(EAGAIN) || r == AVERROR_EOF) return false;
        if (r < 0) fail(path, "cannot decode frame " + std::to_string(decoded) + " (" + av_error(r) + ")");
        if (decoded == indices[next]) {
          Image rgb = to_rgb(path, frame.get(), v.info, sws_raw);
          out.push_back(resize_to ? resize_bicubic_aa(rgb, (*resize_to)[1], (*resize_to)[0]) : std::move(rgb));
          ++next;
        }
        ++decoded;
        av_frame_unref(frame.get());
        if (next == indices.size()) return true;
      }
    };
    bool done = false;
    while (!done) {
      rc = av_read_frame(v.fmt.get(), pkt.get());
      if (rc == AVERROR_EOF) break;
      if (rc < 0)
        fail(path, "cannot read the video after " + std::to_string(decoded) + " frames (" + av_error(rc) + ")");
      if (pkt->stream_index == v.stream->index) {
        const int s = avcodec_send_packet(ctx.get(), pkt.get());
        if (s < 0 && s != AVERROR(EAGAIN))
          fail(path, "corrupt video data after " + std::to_string(decoded) + " frames (" + av_error(s) + ")");
        done = drain();
      }
      av_packet_unref(pkt.get());
    }
    if (!done) {
      avcodec_send_packet(ctx.get(), nullptr);  // flush the frames the decoder still holds
      drain();
    }
    ok = true;
  } catch (...) {
    sws_freeContext(sws_raw);
    throw;
  }
  sws_freeContext(sws_raw);
  if (ok && next < indices.size()) {
    const int64_t header = v.info.total_frames;
    fail(path, "the video ends after " + std::to_string(decoded) + " frames but frame " +
                   std::to_string(indices[next]) + " was asked for" +
                   (header > 0 ? " (its header says " + std::to_string(header) + " frames: truncated?)" : ""));
  }
  return out;
}

}  // namespace

std::vector<Image> decode_video_frames(const std::string& path, const std::vector<int64_t>& indices,
                                       int64_t max_pixels) {
  return decode_frames(path, indices, max_pixels, std::nullopt);
}

NativeVideo decode_native_video(const std::string& path, const NativeResolutionConfig& cfg,
                                const VideoInfo& info, std::vector<int64_t> indices,
                                std::array<int, 2> height_width, int64_t max_pixels) {
  NativeVideo v;
  v.info = info;
  v.indices = std::move(indices);
  const std::vector<Image> frames = decode_frames(path, v.indices, max_pixels, height_width);
  v.patches = patchify_frames(frames, cfg);
  // transformers' VideoMetadata.sampled_fps (24 when the frame rate is unknown) and Qwen2_5_VLProcessor.
  const double sampled_fps = v.info.fps > 0 ? static_cast<double>(v.indices.size()) / v.info.total_frames * v.info.fps
                                            : 24.0;
  v.second_per_grid_ts = cfg.temporal_patch_size / sampled_fps;
  return v;
}

NativeVideo preprocess_native_video(const std::string& path, const NativeResolutionConfig& cfg,
                                    const VideoSampling& sampling, int64_t max_pixels) {
  const VideoInfo info = probe_video_file(path, max_pixels);
  std::vector<int64_t> indices;
  try {
    indices = sample_frame_indices(info.total_frames, info.fps, sampling, cfg.temporal_patch_size);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(path + ": " + e.what());
  }
  const auto hw = smart_resize(info.height, info.width, cfg.factor(), cfg.min_pixels, cfg.max_pixels);
  return decode_native_video(path, cfg, info, std::move(indices), hw, max_pixels);
}

}  // namespace gmod

// Video input for Qwen2-VL / Qwen2.5-VL / Qwen3-VL: decoding with FFmpeg's libraries (libavformat,
// libavcodec, libswscale, libavutil) to 8-bit RGB frames, frame sampling as transformers 5.24's
// Qwen2VLVideoProcessor does it (by fps or by a frame count, multiples of temporal_patch_size;
// Qwen3VLVideoProcessor's evenly spread frames), then the native-resolution resize, normalisation and patch
// layout of data/native_resolution.h with temporal_patch_size frames per temporal patch, and the seconds per
// temporal grid step Qwen2.5-VL's M-RoPE needs. The frames match transformers' default video backend (PyAV,
// `to_ndarray("rgb24")`): swscale with SWS_BILINEAR and the frame's own colour space, as PyAV calls it.
// Torch-free.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/image.h"
#include "data/native_resolution.h"

namespace gmod {

// What the container says about its first video stream (as transformers' PyAV loader reads it).
struct VideoInfo {
  int width = 0;
  int height = 0;
  int64_t total_frames = 0;  // the stream's frame count (nb_frames); counted by demuxing when the header has none
  double fps = 0.0;          // the stream's average frame rate; 0 when unknown
  std::string codec;         // decoder name, e.g. "mpeg4", "h264"
};

// Frame sampling (Qwen2VLVideoProcessor.sample_frames). At most one of fps / num_frames; neither: every frame.
struct VideoSampling {
  std::optional<double> fps;       // frames per second to sample
  std::optional<int> num_frames;   // frames to sample, rounded to a multiple of temporal_patch_size
  int min_frames = 4;
  int max_frames = 768;
};

// Opens `path` and reads its stream header. Throws std::runtime_error naming the file for a missing or unreadable
// file, a file FFmpeg cannot demux, one with no video stream or no decoder for it, and for frames of more than
// max_pixels pixels.
VideoInfo probe_video_file(const std::string& path, int64_t max_pixels = kDefaultMaxImagePixels);

// The frame indices transformers samples: with num_frames, round(num_frames / T) * T of them; with fps,
// total / video_fps * fps clamped to [min_frames, min(max_frames, total) floored to T, total] and floored to T;
// indices as torch.arange(0, total, total / n).int() computes them in float32 (see video.cpp: ATen's vectorised fill
// rounds some values of long videos differently from float(i * step)).
// Throws std::invalid_argument when both are given, when fps is asked of a video without a frame rate, or when the
// count exceeds total_frames or is zero.
std::vector<int64_t> sample_frame_indices(int64_t total_frames, double video_fps, const VideoSampling& sampling,
                                          int temporal_patch_size);

// Qwen3VLVideoProcessor.sample_frames (transformers 5.24): n frames spread over the whole video,
// np.linspace(0, total - 1, n) rounded half to even. n: num_frames as given; with fps, int(total / video_fps
// * fps) clamped to [min_frames, max_frames] and then to total (a video without a frame rate counts as 24
// fps, as transformers assumes); neither: every frame. Throws std::invalid_argument when both are given, or
// when n is 0 or exceeds total_frames (the indices would repeat).
std::vector<int64_t> sample_frame_indices_uniform(int64_t total_frames, double video_fps,
                                                  const VideoSampling& sampling);

// Qwen3-VL's smart_resize for videos (video_processing_qwen3_vl.py): as smart_resize, but the pixel bounds
// hold for the frames together: round(frames / temporal_factor) * temporal_factor frames of h_bar * w_bar
// pixels are compared with [min_pixels, max_pixels], and beta scales frames * height * width. A side below
// `factor` is first scaled up (truncating). Throws std::invalid_argument for fewer frames than
// temporal_factor, non-positive sizes or an aspect ratio above 200.
std::array<int, 2> smart_resize_video(int64_t frames, int height, int width, int temporal_factor, int factor,
                                      int64_t min_pixels, int64_t max_pixels);

// Decodes the frames at `indices` (ascending) to RGB, stopping after the last one. Throws std::runtime_error naming
// the file for everything probe_video_file rejects, for a packet the decoder rejects, and for a video that ends before
// the last index (a truncated file); never returns fewer frames than asked.
std::vector<Image> decode_video_frames(const std::string& path, const std::vector<int64_t>& indices,
                                       int64_t max_pixels = kDefaultMaxImagePixels);

// A video as Qwen2.5-VL takes it: patches [grid_t * grid_h * grid_w, 3 * T * P * P] with video_grid_thw, the sampled
// indices, and second_per_grid_ts = T / sampled_fps, sampled_fps = indices / total_frames * fps (Qwen2_5_VLProcessor;
// 24 fps assumed when the video has no frame rate, as transformers' VideoMetadata does). The resize is smart_resize
// on the frame size with cfg's min/max pixels per frame (no total-video pixel budget: cap_pixels_per_frame = False).
struct NativeVideo {
  NativePatches patches;
  std::vector<int64_t> indices;
  double second_per_grid_ts = 0.0;
  VideoInfo info;
};
// The frames `indices` of `path` (probed as `info`) resized to `height_width` and laid out as patches; the
// seconds per temporal step as preprocess_native_video computes them. Same errors as decode_video_frames.
NativeVideo decode_native_video(const std::string& path, const NativeResolutionConfig& cfg,
                                const VideoInfo& info, std::vector<int64_t> indices,
                                std::array<int, 2> height_width, int64_t max_pixels = kDefaultMaxImagePixels);
NativeVideo preprocess_native_video(const std::string& path, const NativeResolutionConfig& cfg,
                                    const VideoSampling& sampling = {},
                                    int64_t max_pixels = kDefaultMaxImagePixels);

}  // namespace gmod

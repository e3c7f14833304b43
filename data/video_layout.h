// What one model family's video processor decides about a video: its settings' defaults, which frames are
// taken, the size every frame is resized to, and the tokens the video occupies in the sequence. VideoPreparer
// (data/video_prep.h) asks its layout and names no family; make_video_preparer picks the layout from the
// model.
//   Qwen2.5-VL (Qwen2VLVideoProcessor + Qwen2_5_VLProcessor): frames by fps or count in multiples of
//     temporal_patch_size, smart_resize per frame, <|vision_start|> <|video_pad|> x t*h*w/merge^2
//     <|vision_end|>.
//   Qwen3-VL (Qwen3VLVideoProcessor + Qwen3VLProcessor, transformers 5.24): frames spread evenly (fps 2 by
//   default),
//     smart_resize over the frames together, and per temporal step "<t seconds>" text (the mean time of the
//     step's first and last frame, one decimal) then <|vision_start|> <|video_pad|> x h*w/merge^2
//     <|vision_end|>, all inside the template's own <|vision_start|> ... <|vision_end|>.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/image_prep.h"
#include "data/native_resolution.h"
#include "data/video.h"

namespace gmod {

class Tokenizer;

// A video processor's settings: the resize / normalisation / patch layout and the frame sampling.
struct VideoProcessorConfig {
  NativeResolutionConfig resolution;
  VideoSampling sampling;  // neither fps nor num_frames: every frame (do_sample_frames false)
};

class VideoLayout {
 public:
  virtual ~VideoLayout() = default;
  // The video processor class's own defaults (where its config file has no key).
  virtual VideoProcessorConfig defaults() const = 0;
  // The sampled frame indices (ascending) of a video of `info`. Throws std::invalid_argument when `sampling`
  // cannot be met.
  virtual std::vector<int64_t> sample(const VideoInfo& info, const VideoProcessorConfig& cfg) const = 0;
  // {height, width} every sampled frame is resized to, for `frames` sampled frames.
  virtual std::array<int, 2> frame_size(const VideoInfo& info, int64_t frames,
                                        const NativeResolutionConfig& r) const = 0;
  // The video's tokens: grid_thw after the temporal patches; `indices` and info.fps for the timestamps.
  virtual VideoTokens tokens(const VideoInfo& info, const std::vector<int64_t>& indices,
                             const std::array<int64_t, 3>& grid_thw,
                             const NativeResolutionConfig& r) const = 0;
  // "Qwen2.5-VL" / "Qwen3-VL" for logs.
  virtual std::string family() const = 0;
};

// The vision token ids a layout writes (<|video_pad|>, <|vision_start|>, <|vision_end|>).
struct VideoTokenIds {
  int32_t video = 0, start = 0, end = 0;
};

std::shared_ptr<const VideoLayout> make_qwen2_5_vl_video_layout(VideoTokenIds ids);
// `tokenizer` encodes the timestamps' text; the layout keeps it.
std::shared_ptr<const VideoLayout> make_qwen3_vl_video_layout(VideoTokenIds ids,
                                                              std::shared_ptr<const Tokenizer> tokenizer);

// Qwen3VLProcessor's timestamps: index / fps (24 when the video has none) per sampled frame, the indices
// padded to a multiple of `temporal_patch_size` with the last one, then the mean of each step's first and
// last frame.
std::vector<double> video_step_timestamps(const std::vector<int64_t>& indices, double fps,
                                          int temporal_patch_size);

}  // namespace gmod

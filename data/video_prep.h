// How the videos of a record become model input (Qwen2.5-VL, Qwen3-VL): the settings the family's video
// processor reads from a model directory, the tokens a video occupies in the sequence (known from the
// container's header before decoding), and its patches, grid and seconds per temporal grid step
// (data/video.h). What differs between families (defaults, frame sampling, frame size, tokens) is the model's
// VideoLayout (data/video_layout.h). Models without video input have no preparer: the dataset then refuses a
// record with a video as a bad record (reason "video").
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/image_prep.h"
#include "data/video.h"
#include "data/video_layout.h"

namespace gmod {

struct LlavaConfig;
class Tokenizer;

// Qwen2VLVideoProcessor's defaults where a key is missing: min_pixels 128*28*28, max_pixels 28*28*768 (not the image
// processor's), min_frames 4, max_frames 768, do_sample_frames false.
VideoProcessorConfig default_video_processor_config();

// Reads a video_preprocessor_config.json, or a preprocessor_config.json (what from_pretrained falls back to):
// the keys of load_native_resolution_config plus do_sample_frames, fps, num_frames, min_frames and max_frames
// (fps / num_frames only count with do_sample_frames true, as in transformers); a missing key keeps
// `defaults`' value (the family's class defaults, VideoLayout::defaults). Throws std::runtime_error naming
// the file and the key.
VideoProcessorConfig load_video_processor_config(
    const std::string& path, const VideoProcessorConfig& defaults = default_video_processor_config());

// What a video will be, from its header: the sampled frame indices, the frame size, the grid, the tokens and
// the seconds per step.
struct VideoPlan {
  VideoInfo info;
  std::vector<int64_t> indices;
  std::array<int, 2> frame_size{};  // {height, width} after the resize
  std::array<int64_t, 3> grid_thw{};
  double second_per_grid_ts = 0.0;
  VideoTokens tokens;
};

class VideoPreparer {
 public:
  VideoPreparer(VideoProcessorConfig cfg, std::shared_ptr<const VideoLayout> layout);
  // Probes `path` and samples its frames. Throws (std::runtime_error / std::invalid_argument) naming the file for a
  // missing, unreadable, corrupt or unsupported video and one whose frames cannot be sampled as configured.
  VideoPlan plan(const std::string& path, int64_t max_pixels) const;
  // Decodes and lays out the video; same errors, and a truncated file.
  NativeVideo prepare(const std::string& path, int64_t max_pixels) const;
  const VideoProcessorConfig& config() const { return cfg_; }
  const VideoLayout& layout() const { return *layout_; }
  std::string describe() const;

 private:
  VideoProcessorConfig cfg_;
  std::shared_ptr<const VideoLayout> layout_;
};

// The model's video preparer: null unless it has a Qwen2.5-VL or Qwen3-VL vision encoder (the layout follows
// the encoder). The settings come from `preprocessor_dir`'s video_preprocessor_config.json, else its
// preprocessor_config.json, else the family's defaults with the encoder's patch, temporal patch and merge
// sizes;
// <|vision_start|>, <|vision_end|> and <|video_pad|> from `tokenizer`, which must give <|video_pad|> the
// model's video_token_id (Qwen3-VL's layout keeps the tokenizer for its timestamps). Throws
// std::invalid_argument naming what disagrees.
std::shared_ptr<const VideoPreparer> make_video_preparer(const LlavaConfig& model,
                                                         const std::string& preprocessor_dir,
                                                         std::shared_ptr<const Tokenizer> tokenizer);

}  // namespace gmod

// The Qwen2.5-VL and Qwen3-VL video layouts. See video_layout.h.
#include "data/video_layout.h"

#include <cstdio>
#include <stdexcept>

#include "data/tokenizer.h"

namespace gmod {

namespace {

class Qwen25VideoLayout : public VideoLayout {
 public:
  explicit Qwen25VideoLayout(VideoTokenIds ids) : ids_(ids) {}
  // Qwen2VLVideoProcessor: min_pixels 128*28*28, max_pixels 28*28*768 (not the image processor's), min_frames
  // 4, max_frames 768, do_sample_frames false.
  VideoProcessorConfig defaults() const override {
    VideoProcessorConfig c;
    c.resolution.min_pixels = 128 * 28 * 28;
    c.resolution.max_pixels = 28 * 28 * 768;
    return c;
  }
  std::vector<int64_t> sample(const VideoInfo& info, const VideoProcessorConfig& cfg) const override {
    return sample_frame_indices(info.total_frames, info.fps, cfg.sampling,
                                cfg.resolution.temporal_patch_size);
  }
  std::array<int, 2> frame_size(const VideoInfo& info, int64_t,
                                const NativeResolutionConfig& r) const override {
    return smart_resize(info.height, info.width, r.factor(), r.min_pixels, r.max_pixels);
  }
  VideoTokens tokens(const VideoInfo&, const std::vector<int64_t>&, const std::array<int64_t, 3>& g,
                     const NativeResolutionConfig& r) const override {
    VideoTokens t;
    t.id = ids_.video;
    t.ids.reserve(static_cast<size_t>(g[0] * g[1] * g[2] / (r.merge_size * r.merge_size) + 2));
    t.ids.push_back(ids_.start);
    t.ids.insert(t.ids.end(), static_cast<size_t>(g[0] * g[1] * g[2] / (r.merge_size * r.merge_size)),
                 ids_.video);
    t.ids.push_back(ids_.end);
    return t;
  }
  std::string family() const override { return "Qwen2.5-VL"; }

 private:
  VideoTokenIds ids_;
};

class Qwen3VideoLayout : public VideoLayout {
 public:
  Qwen3VideoLayout(VideoTokenIds ids, std::shared_ptr<const Tokenizer> tok)
      : ids_(ids), tok_(std::move(tok)) {
    if (!tok_) throw std::invalid_argument("Qwen3-VL video layout: no tokenizer for the timestamps");
  }
  // Qwen3VLVideoProcessor: size.shortest_edge 128*32*32 and size.longest_edge 32*32*768 (pixels of all frames
  // together), mean = std = 0.5, patch 16, temporal 2, merge 2, do_sample_frames true at fps 2, 4 to 768
  // frames.
  VideoProcessorConfig defaults() const override {
    VideoProcessorConfig c;
    auto& r = c.resolution;
    r.patch_size = 16, r.temporal_patch_size = 2, r.merge_size = 2;
    r.min_pixels = 128 * 32 * 32;
    r.max_pixels = 32 * 32 * 768;
    r.mean = {0.5f, 0.5f, 0.5f};
    r.std = {0.5f, 0.5f, 0.5f};
    c.sampling.fps = 2.0;
    return c;
  }
  std::vector<int64_t> sample(const VideoInfo& info, const VideoProcessorConfig& cfg) const override {
    return sample_frame_indices_uniform(info.total_frames, info.fps, cfg.sampling);
  }
  std::array<int, 2> frame_size(const VideoInfo& info, int64_t frames,
                                const NativeResolutionConfig& r) const override {
    return smart_resize_video(frames, info.height, info.width, r.temporal_patch_size, r.factor(),
                              r.min_pixels, r.max_pixels);
  }
  VideoTokens tokens(const VideoInfo& info, const std::vector<int64_t>& indices,
                     const std::array<int64_t, 3>& g, const NativeResolutionConfig& r) const override {
    const std::vector<double> times = video_step_timestamps(indices, info.fps, r.temporal_patch_size);
    if (static_cast<int64_t>(times.size()) != g[0])
      throw std::logic_error("Qwen3-VL video layout: " + std::to_string(times.size()) + " timestamps for " +
                             std::to_string(g[0]) + " temporal steps");
    const int64_t per_frame = g[1] * g[2] / (r.merge_size * r.merge_size);
    VideoTokens t;
    t.id = ids_.video;
    t.ids.push_back(
        ids_.start);  // the chat template's own <|vision_start|><|video_pad|><|vision_end|> around it
    for (double s : times) {
      char text[64];
      std::snprintf(text, sizeof(text), "<%.1f seconds>",
                    s);  // Python's f"{s:.1f}": the double correctly rounded
      const std::vector<int32_t> ids = tok_->encode(text, /*parse_special=*/false);
      t.ids.insert(t.ids.end(), ids.begin(), ids.end());
      t.ids.push_back(ids_.start);
      t.ids.insert(t.ids.end(), static_cast<size_t>(per_frame), ids_.video);
      t.ids.push_back(ids_.end);
    }
    t.ids.push_back(ids_.end);
    return t;
  }
  std::string family() const override { return "Qwen3-VL"; }

 private:
  VideoTokenIds ids_;
  std::shared_ptr<const Tokenizer> tok_;
};

}  // namespace

std::vector<double> video_step_timestamps(const std::vector<int64_t>& indices, double fps,
                                          int temporal_patch_size) {
  if (indices.empty() || temporal_patch_size < 1) return {};
  const double rate = fps > 0 ? fps : 24.0;
  std::vector<int64_t> idx = indices;
  while (idx.size() % static_cast<size_t>(temporal_patch_size)) idx.push_back(idx.back());
  std::vector<double> out;
  for (size_t i = 0; i < idx.size(); i += static_cast<size_t>(temporal_patch_size)) {
    const double first = static_cast<double>(idx[i]) / rate;
    const double last = static_cast<double>(idx[i + static_cast<size_t>(temporal_patch_size) - 1]) / rate;
    out.push_back((first + last) / 2);
  }
  return out;
}

std::shared_ptr<const VideoLayout> make_qwen2_5_vl_video_layout(VideoTokenIds ids) {
  return std::make_shared<Qwen25VideoLayout>(ids);
}

std::shared_ptr<const VideoLayout> make_qwen3_vl_video_layout(VideoTokenIds ids,
                                                              std::shared_ptr<const Tokenizer> tokenizer) {
  return std::make_shared<Qwen3VideoLayout>(ids, std::move(tokenizer));
}

}  // namespace gmod

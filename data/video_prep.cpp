// Video settings, token spans and patches for Qwen2.5-VL samples.
#include "data/video_prep.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "data/tokenizer.h"
#include "model/config.h"

namespace gmod {

VideoProcessorConfig default_video_processor_config() {
  VideoProcessorConfig c;
  c.resolution.min_pixels = 128 * 28 * 28;
  c.resolution.max_pixels = 28 * 28 * 768;
  return c;
}

VideoProcessorConfig load_video_processor_config(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error(path + ": cannot open video preprocessor config");
  nlohmann::json j;
  try {
    f >> j;
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": invalid JSON: " + e.what());
  }
  if (!j.is_object()) throw std::runtime_error(path + ": expected a JSON object");
  VideoProcessorConfig c = default_video_processor_config();
  // The resize keys as the image side reads them; missing pixel bounds keep the video processor's own defaults.
  const NativeResolutionConfig read = load_native_resolution_config(path);
  const bool has_min = j.contains("min_pixels") || (j.contains("size") && j["size"].contains("shortest_edge"));
  const bool has_max = j.contains("max_pixels") || (j.contains("size") && j["size"].contains("longest_edge"));
  const NativeResolutionConfig defaults = c.resolution;
  c.resolution = read;
  if (!has_min) c.resolution.min_pixels = defaults.min_pixels;
  if (!has_max) c.resolution.max_pixels = defaults.max_pixels;
  if (c.resolution.min_pixels > c.resolution.max_pixels)
    throw std::runtime_error(path + ": min_pixels " + std::to_string(c.resolution.min_pixels) +
                             " exceeds max_pixels " + std::to_string(c.resolution.max_pixels));
  auto positive_int = [&](const char* key, int fallback) {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_number_integer() || j[key].get<int64_t>() < 1)
      throw std::runtime_error(path + ": '" + key + "' must be a positive integer, got " + j[key].dump());
    return j[key].get<int>();
  };
  if (j.contains("cap_pixels_per_frame") && j["cap_pixels_per_frame"].is_boolean() &&
      j["cap_pixels_per_frame"].get<bool>())
    throw std::runtime_error(path + ": 'cap_pixels_per_frame' true (a total-video pixel budget) is not supported; "
                                    "only the per-frame min/max pixels are");
  c.sampling.min_frames = positive_int("min_frames", c.sampling.min_frames);
  c.sampling.max_frames = positive_int("max_frames", c.sampling.max_frames);
  bool sample = false;
  if (j.contains("do_sample_frames") && !j["do_sample_frames"].is_null()) {
    if (!j["do_sample_frames"].is_boolean())
      throw std::runtime_error(path + ": 'do_sample_frames' must be true or false, got " +
                               j["do_sample_frames"].dump());
    sample = j["do_sample_frames"].get<bool>();
  }
  if (sample) {
    if (j.contains("fps") && !j["fps"].is_null()) {
      if (!j["fps"].is_number() || j["fps"].get<double>() <= 0)
        throw std::runtime_error(path + ": 'fps' must be a positive number, got " + j["fps"].dump());
      c.sampling.fps = j["fps"].get<double>();
    }
    if (j.contains("num_frames") && !j["num_frames"].is_null()) c.sampling.num_frames = positive_int("num_frames", 0);
    if (c.sampling.fps && c.sampling.num_frames)
      throw std::runtime_error(path + ": 'fps' and 'num_frames' exclude each other (transformers refuses both)");
  }
  return c;
}

VideoPreparer::VideoPreparer(VideoProcessorConfig cfg, int32_t video_token_id, int32_t vision_start,
                             int32_t vision_end)
    : cfg_(std::move(cfg)), id_(video_token_id), start_(vision_start), end_(vision_end) {
  const auto& r = cfg_.resolution;
  if (r.patch_size < 1 || r.merge_size < 1 || r.temporal_patch_size < 1)
    throw std::invalid_argument("video preparer: patch_size, merge_size and temporal_patch_size must be >= 1");
}

VideoPlan VideoPreparer::plan(const std::string& path, int64_t max_pixels) const {
  const auto& r = cfg_.resolution;
  VideoPlan p;
  p.info = probe_video_file(path, max_pixels);
  try {
    p.indices = sample_frame_indices(p.info.total_frames, p.info.fps, cfg_.sampling, r.temporal_patch_size);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(path + ": " + e.what());
  }
  const auto hw = smart_resize(p.info.height, p.info.width, r.factor(), r.min_pixels, r.max_pixels);
  const int64_t T = r.temporal_patch_size, n = static_cast<int64_t>(p.indices.size());
  p.grid_thw = {(n + T - 1) / T, hw[0] / r.patch_size, hw[1] / r.patch_size};  // a short last step repeats a frame
  // As preprocess_native_video (transformers' VideoMetadata.sampled_fps, 24 when the rate is unknown).
  const double sampled_fps = p.info.fps > 0 ? static_cast<double>(n) / p.info.total_frames * p.info.fps : 24.0;
  p.second_per_grid_ts = T / sampled_fps;
  const int64_t m = r.merge_size;
  p.tokens = {start_, id_, p.grid_thw[0] * p.grid_thw[1] * p.grid_thw[2] / (m * m), end_};
  return p;
}

NativeVideo VideoPreparer::prepare(const std::string& path, int64_t max_pixels) const {
  return preprocess_native_video(path, cfg_.resolution, cfg_.sampling, max_pixels);
}

std::string VideoPreparer::describe() const {
  const auto& r = cfg_.resolution;
  const auto& s = cfg_.sampling;
  std::string how = s.fps ? "at " + std::to_string(*s.fps) + " fps (" + std::to_string(s.min_frames) + " to " +
                                std::to_string(s.max_frames) + " frames)"
                  : s.num_frames ? std::to_string(*s.num_frames) + " frames"
                                 : "every frame";
  return "videos " + how + ", " + std::to_string(r.min_pixels) + " to " + std::to_string(r.max_pixels) +
         " pixels per frame";
}

std::shared_ptr<const VideoPreparer> make_video_preparer(const LlavaConfig& model, const std::string& preprocessor_dir,
                                                         const Tokenizer& tokenizer) {
  if (!model.qwen_vision || !model.mrope) return nullptr;
  const Qwen25VisionConfig& v = *model.qwen_vision;
  VideoProcessorConfig cfg = default_video_processor_config();
  std::string source = "the video processor's defaults";
  if (!preprocessor_dir.empty()) {
    for (const char* name : {"video_preprocessor_config.json", "preprocessor_config.json"}) {
      const std::filesystem::path p = std::filesystem::path(preprocessor_dir) / name;
      if (!std::filesystem::exists(p)) continue;
      cfg = load_video_processor_config(p.string());
      source = p.string();
      break;
    }
  }
  if (source == "the video processor's defaults") {
    cfg.resolution.patch_size = static_cast<int>(v.patch_size);
    cfg.resolution.temporal_patch_size = static_cast<int>(v.temporal_patch_size);
    cfg.resolution.merge_size = static_cast<int>(v.spatial_merge_size);
  }
  const auto& r = cfg.resolution;
  if (r.patch_size != v.patch_size || r.temporal_patch_size != v.temporal_patch_size ||
      r.merge_size != v.spatial_merge_size)
    throw std::invalid_argument(source + ": patch_size " + std::to_string(r.patch_size) + ", temporal_patch_size " +
                                std::to_string(r.temporal_patch_size) + ", merge_size " +
                                std::to_string(r.merge_size) + " differ from the vision encoder's (" +
                                std::to_string(v.patch_size) + ", " + std::to_string(v.temporal_patch_size) + ", " +
                                std::to_string(v.spatial_merge_size) + ")");
  auto need = [&](const char* name) {
    const auto id = tokenizer.token_to_id(name);
    if (!id) throw std::invalid_argument(std::string("videos need the token ") + name + " in the tokenizer");
    return *id;
  };
  const int32_t start = need("<|vision_start|>"), end = need("<|vision_end|>"), pad = need("<|video_pad|>");
  if (pad != model.mrope->video_token_id)
    throw std::invalid_argument("the tokenizer's <|video_pad|> is id " + std::to_string(pad) +
                                ", the model's video_token_id " + std::to_string(model.mrope->video_token_id));
  return std::make_shared<VideoPreparer>(std::move(cfg), pad, start, end);
}

}  // namespace gmod

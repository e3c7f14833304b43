// Video settings, token spans and patches for Qwen2.5-VL and Qwen3-VL samples.
#include "data/video_prep.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "data/tokenizer.h"
#include "model/config.h"

namespace gmod {

VideoProcessorConfig default_video_processor_config() { return make_qwen2_5_vl_video_layout({})->defaults(); }

VideoProcessorConfig load_video_processor_config(const std::string& path,
                                                 const VideoProcessorConfig& defaults) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error(path + ": cannot open video preprocessor config");
  nlohmann::json j;
  try {
    f >> j;
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": invalid JSON: " + e.what());
  }
  if (!j.is_object()) throw std::runtime_error(path + ": expected a JSON object");
  // The resize keys as the image side reads them; a missing key keeps the video processor's own default.
  const NativeResolutionConfig read = load_native_resolution_config(path);
  auto has = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  const bool sized = j.contains("size") && j["size"].is_object();
  const bool has_min = has("min_pixels") || (sized && j["size"].contains("shortest_edge"));
  const bool has_max = has("max_pixels") || (sized && j["size"].contains("longest_edge"));
  VideoProcessorConfig c = defaults;
  const NativeResolutionConfig& d = defaults.resolution;
  c.resolution = read;
  if (!has_min) c.resolution.min_pixels = d.min_pixels;
  if (!has_max) c.resolution.max_pixels = d.max_pixels;
  if (!has("patch_size")) c.resolution.patch_size = d.patch_size;
  if (!has("temporal_patch_size")) c.resolution.temporal_patch_size = d.temporal_patch_size;
  if (!has("merge_size")) c.resolution.merge_size = d.merge_size;
  if (!has("image_mean")) c.resolution.mean = d.mean;
  if (!has("image_std")) c.resolution.std = d.std;
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
  bool sample = defaults.sampling.fps || defaults.sampling.num_frames;  // the class's do_sample_frames
  if (has("do_sample_frames")) {
    if (!j["do_sample_frames"].is_boolean())
      throw std::runtime_error(path + ": 'do_sample_frames' must be true or false, got " +
                               j["do_sample_frames"].dump());
    sample = j["do_sample_frames"].get<bool>();
  }
  if (!sample) {
    c.sampling.fps.reset();
    c.sampling.num_frames.reset();
  } else {
    if (has("fps") && has("num_frames"))
      throw std::runtime_error(path +
                               ": 'fps' and 'num_frames' exclude each other (transformers refuses both)");
    if (has("fps")) {
      if (!j["fps"].is_number() || j["fps"].get<double>() <= 0)
        throw std::runtime_error(path + ": 'fps' must be a positive number, got " + j["fps"].dump());
      c.sampling.fps = j["fps"].get<double>();
      c.sampling.num_frames.reset();
    }
    if (has("num_frames")) {
      c.sampling.num_frames = positive_int("num_frames", 0);
      c.sampling.fps.reset();
    }
  }
  return c;
}

VideoPreparer::VideoPreparer(VideoProcessorConfig cfg, std::shared_ptr<const VideoLayout> layout)
    : cfg_(std::move(cfg)), layout_(std::move(layout)) {
  const auto& r = cfg_.resolution;
  if (r.patch_size < 1 || r.merge_size < 1 || r.temporal_patch_size < 1)
    throw std::invalid_argument("video preparer: patch_size, merge_size and temporal_patch_size must be >= 1");
  if (!layout_) throw std::invalid_argument("video preparer: no video layout");
}

VideoPlan VideoPreparer::plan(const std::string& path, int64_t max_pixels) const {
  const auto& r = cfg_.resolution;
  VideoPlan p;
  p.info = probe_video_file(path, max_pixels);
  const int64_t T = r.temporal_patch_size;
  try {
    p.indices = layout_->sample(p.info, cfg_);
    p.frame_size = layout_->frame_size(p.info, static_cast<int64_t>(p.indices.size()), r);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(path + ": " + e.what());
  }
  const int64_t n = static_cast<int64_t>(p.indices.size());
  // A short last step repeats a frame.
  p.grid_thw = {(n + T - 1) / T, p.frame_size[0] / r.patch_size, p.frame_size[1] / r.patch_size};
  // As decode_native_video (transformers' VideoMetadata.sampled_fps, 24 when the rate is unknown).
  const double sampled_fps = p.info.fps > 0 ? static_cast<double>(n) / p.info.total_frames * p.info.fps : 24.0;
  p.second_per_grid_ts = T / sampled_fps;
  p.tokens = layout_->tokens(p.info, p.indices, p.grid_thw, r);
  return p;
}

NativeVideo VideoPreparer::prepare(const std::string& path, int64_t max_pixels) const {
  VideoPlan p = plan(path, max_pixels);
  return decode_native_video(path, cfg_.resolution, p.info, std::move(p.indices), p.frame_size, max_pixels);
}

std::string VideoPreparer::describe() const {
  const auto& r = cfg_.resolution;
  const auto& s = cfg_.sampling;
  std::string how = s.fps ? "at " + std::to_string(*s.fps) + " fps (" + std::to_string(s.min_frames) + " to " +
                                std::to_string(s.max_frames) + " frames)"
                  : s.num_frames ? std::to_string(*s.num_frames) + " frames"
                                 : "every frame";
  return layout_->family() + " videos " + how + ", " + std::to_string(r.min_pixels) + " to " +
         std::to_string(r.max_pixels) + " pixels (the family's resize bounds)";
}

std::shared_ptr<const VideoPreparer> make_video_preparer(const LlavaConfig& model,
                                                         const std::string& preprocessor_dir,
                                                         std::shared_ptr<const Tokenizer> tokenizer) {
  if ((!model.qwen_vision && !model.qwen3_vision) || !model.mrope) return nullptr;
  if (!tokenizer) throw std::invalid_argument("make_video_preparer: no tokenizer");
  // The encoder's patch geometry, whichever Qwen encoder the model has.
  const int64_t patch = model.qwen_vision ? model.qwen_vision->patch_size : model.qwen3_vision->patch_size;
  const int64_t temporal =
      model.qwen_vision ? model.qwen_vision->temporal_patch_size : model.qwen3_vision->temporal_patch_size;
  const int64_t merge =
      model.qwen_vision ? model.qwen_vision->spatial_merge_size : model.qwen3_vision->spatial_merge_size;
  auto need = [&](const char* name) {
    const auto id = tokenizer->token_to_id(name);
    if (!id) throw std::invalid_argument(std::string("videos need the token ") + name + " in the tokenizer");
    return *id;
  };
  const VideoTokenIds ids{need("<|video_pad|>"), need("<|vision_start|>"), need("<|vision_end|>")};
  if (ids.video != model.mrope->video_token_id)
    throw std::invalid_argument("the tokenizer's <|video_pad|> is id " + std::to_string(ids.video) +
                                ", the model's video_token_id " +
                                std::to_string(model.mrope->video_token_id));
  // The one place that picks the family's layout: Qwen3-VL's encoder writes timestamps, Qwen2.5-VL's does
  // not.
  std::shared_ptr<const VideoLayout> layout =
      model.qwen3_vision ? make_qwen3_vl_video_layout(ids, tokenizer) : make_qwen2_5_vl_video_layout(ids);
  VideoProcessorConfig cfg = layout->defaults();
  std::string source = "the video processor's defaults";
  if (!preprocessor_dir.empty()) {
    for (const char* name : {"video_preprocessor_config.json", "preprocessor_config.json"}) {
      const std::filesystem::path p = std::filesystem::path(preprocessor_dir) / name;
      if (!std::filesystem::exists(p)) continue;
      cfg = load_video_processor_config(p.string(), layout->defaults());
      source = p.string();
      break;
    }
  }
  if (source == "the video processor's defaults") {
    cfg.resolution.patch_size = static_cast<int>(patch);
    cfg.resolution.temporal_patch_size = static_cast<int>(temporal);
    cfg.resolution.merge_size = static_cast<int>(merge);
  }
  const auto& r = cfg.resolution;
  if (r.patch_size != patch || r.temporal_patch_size != temporal || r.merge_size != merge)
    throw std::invalid_argument(source + ": patch_size " + std::to_string(r.patch_size) +
                                ", temporal_patch_size " + std::to_string(r.temporal_patch_size) +
                                ", merge_size " + std::to_string(r.merge_size) +
                                " differ from the vision encoder's (" + std::to_string(patch) + ", " +
                                std::to_string(temporal) + ", " + std::to_string(merge) + ")");
  return std::make_shared<VideoPreparer>(std::move(cfg), std::move(layout));
}

}  // namespace gmod

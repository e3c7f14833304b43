// Qwen2.5-VL's configuration beyond the Qwen2 text model: the vision encoder's (config.json vision_config;
// the encoder is model/qwen2_5_vl_vision.h) and the multimodal rotary positions' (model/mrope.h). Plain
// structs read from a config.json, kept apart from their modules so that LlavaConfig (model/config.h) can
// hold them.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace gmod {

// A Qwen2.5-VL config.json's vision_config.
struct Qwen25VisionConfig {
  int64_t depth = 32, hidden_size = 1280, intermediate_size = 3420, num_heads = 16, in_channels = 3,
          patch_size = 14, temporal_patch_size = 2, spatial_merge_size = 2, window_size = 112,
          out_hidden_size = 3584, tokens_per_second = 2;
  std::vector<int64_t> fullatt_block_indexes = {7, 15, 23, 31};
  std::string hidden_act = "silu";  // the blocks' MLP ("silu" or "gelu"); the merger's GELU is fixed
  double rope_theta = 10000.0;      // vision_config.rope_parameters.rope_theta when given
  double initializer_range = 0.02;

  int64_t head_dim() const { return hidden_size / num_heads; }
  int64_t patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  int64_t merge_unit() const { return spatial_merge_size * spatial_merge_size; }
  // Merged units per window side (window_size / spatial_merge_size / patch_size).
  int64_t window_units() const { return window_size / spatial_merge_size / patch_size; }
  // From a config.json's "vision_config" object (in_chans or in_channels); `where` names it in errors, which
  // say which field was missing or inconsistent.
  static Qwen25VisionConfig from_json(const nlohmann::json& vision_config, const std::string& where);
};

struct MRopeConfig {
  int64_t image_token_id = 151655, video_token_id = 151656;
  int64_t spatial_merge_size = 2, tokens_per_second = 2;
  std::vector<int64_t> mrope_section = {16, 24, 24};  // frequencies per axis (t, h, w); sums to head_dim / 2
  double rope_theta = 1e6;
  int64_t head_dim = 128;
  bool interleaved = false;  // Qwen3-VL's mrope_interleaved (LlamaConfig::mrope_interleaved tells how)
  // Qwen3-VL: a video is split into its temporal steps, each a block of grid (1, h, w) between text (its "<t
  // seconds>" timestamp and vision start / end tokens): every step's tokens take temporal id = its start, as
  // an image's, and second_per_grid_ts / tokens_per_second are not used (transformers'
  // Qwen3VLModel.get_rope_index).
  bool video_steps_as_frames = false;
  // From a Qwen2.5-VL config.json: token ids at the top, merge size and tokens_per_second in vision_config,
  // the section and theta in text_config.rope_parameters (transformers 5) or the top-level rope_scaling /
  // rope_theta (the published checkpoints), mrope_interleaved beside mrope_section. `where` names the file in errors.
  static MRopeConfig from_json(const nlohmann::json& config, const std::string& where);
};

}  // namespace gmod

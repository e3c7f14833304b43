// Qwen3-VL's vision encoder configuration (config.json vision_config of model_type qwen3_vl; the encoder is
// model/qwen3_vl_vision.h). A plain struct read from a config.json, kept apart from its module so that LlavaConfig
// (model/config.h) can hold it. The text model is Qwen3 (LlamaConfig::qk_norm) with interleaved M-RoPE
// (LlamaConfig::mrope_interleaved, MRopeConfig::interleaved), read by the common parsers.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace gmod {

struct Qwen3VisionConfig {
  int64_t depth = 27, hidden_size = 1152, intermediate_size = 4304, num_heads = 16, in_channels = 3,
          patch_size = 16, temporal_patch_size = 2, spatial_merge_size = 2, out_hidden_size = 3584,
          num_position_embeddings = 2304;
  // Blocks after which a DeepStack merger takes the hidden states; its features are added to the hidden states of
  // LLM layer j (the j-th entry) at the image positions.
  std::vector<int64_t> deepstack_visual_indexes = {8, 16, 24};
  std::string hidden_act = "gelu_pytorch_tanh";  // the blocks' MLP ("gelu_pytorch_tanh" or "gelu"); mergers: GELU
  double rope_theta = 10000.0;                   // vision_config.rope_parameters.rope_theta when given
  double initializer_range = 0.02;

  int64_t head_dim() const { return hidden_size / num_heads; }
  int64_t patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  int64_t merge_unit() const { return spatial_merge_size * spatial_merge_size; }
  // Side of the square learned position grid: sqrt(num_position_embeddings).
  int64_t grid_side() const;
  // From a config.json's "vision_config" object; `where` names it in errors, which say which field was missing or
  // inconsistent.
  static Qwen3VisionConfig from_json(const nlohmann::json& vision_config, const std::string& where);
};

}  // namespace gmod

#include "model/qwen3_vl_config.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace gmod {

namespace {

int64_t positive(const nlohmann::json& j, const char* key, int64_t fallback, const std::string& where) {
  if (!j.contains(key)) return fallback;
  if (!j.at(key).is_number_integer())
    throw std::invalid_argument(where + ": vision_config." + key + " must be an integer, got " + j.at(key).dump());
  const auto v = j.at(key).get<int64_t>();
  if (v <= 0)
    throw std::invalid_argument(where + ": vision_config." + key + " must be positive, got " + std::to_string(v));
  return v;
}

}  // namespace

int64_t Qwen3VisionConfig::grid_side() const {
  return static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(num_position_embeddings))));
}

Qwen3VisionConfig Qwen3VisionConfig::from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw std::invalid_argument(where + ": vision_config is not an object");
  Qwen3VisionConfig c;
  c.depth = positive(j, "depth", c.depth, where);
  c.hidden_size = positive(j, "hidden_size", c.hidden_size, where);
  c.intermediate_size = positive(j, "intermediate_size", c.intermediate_size, where);
  c.num_heads = positive(j, "num_heads", c.num_heads, where);
  c.in_channels = positive(j, j.contains("in_chans") ? "in_chans" : "in_channels", c.in_channels, where);
  c.patch_size = positive(j, "patch_size", c.patch_size, where);
  c.temporal_patch_size = positive(j, "temporal_patch_size", c.temporal_patch_size, where);
  c.spatial_merge_size = positive(j, "spatial_merge_size", c.spatial_merge_size, where);
  c.out_hidden_size = positive(j, "out_hidden_size", c.out_hidden_size, where);
  c.num_position_embeddings = positive(j, "num_position_embeddings", c.num_position_embeddings, where);
  if (j.contains("deepstack_visual_indexes")) {
    if (!j.at("deepstack_visual_indexes").is_array())
      throw std::invalid_argument(where + ": vision_config.deepstack_visual_indexes must be a list of block indexes");
    c.deepstack_visual_indexes = j.at("deepstack_visual_indexes").get<std::vector<int64_t>>();
  }
  if (j.contains("initializer_range")) c.initializer_range = j.at("initializer_range").get<double>();
  if (j.contains("hidden_act")) c.hidden_act = j.at("hidden_act").get<std::string>();
  if (j.contains("rope_parameters") && j.at("rope_parameters").is_object()) {
    const auto& r = j.at("rope_parameters");
    if (r.contains("rope_type") && r.at("rope_type") != "axial")
      throw std::invalid_argument(where + ": vision_config.rope_parameters.rope_type " + r.at("rope_type").dump() +
                                  " is not supported (axial)");
    if (r.contains("rope_theta")) c.rope_theta = r.at("rope_theta").get<double>();
  }
  if (c.hidden_act != "gelu_pytorch_tanh" && c.hidden_act != "gelu")
    throw std::invalid_argument(where + ": vision_config.hidden_act '" + c.hidden_act +
                                "' is not supported (gelu_pytorch_tanh, gelu)");
  if (c.hidden_size % c.num_heads != 0 || c.head_dim() % 4 != 0)
    throw std::invalid_argument(where + ": vision_config hidden_size " + std::to_string(c.hidden_size) +
                                " / num_heads " + std::to_string(c.num_heads) +
                                " must be a head size divisible by 4 (2-D rotary)");
  if (c.grid_side() * c.grid_side() != c.num_position_embeddings)
    throw std::invalid_argument(where + ": vision_config.num_position_embeddings " +
                                std::to_string(c.num_position_embeddings) +
                                " is not a square (the learned position grid is square)");
  for (size_t i = 0; i < c.deepstack_visual_indexes.size(); ++i) {
    const auto b = c.deepstack_visual_indexes[i];
    if (b < 0 || b >= c.depth)
      throw std::invalid_argument(where + ": vision_config.deepstack_visual_indexes holds " + std::to_string(b) +
                                  ", outside depth " + std::to_string(c.depth));
    for (size_t k = 0; k < i; ++k)
      if (c.deepstack_visual_indexes[k] == b)
        throw std::invalid_argument(where + ": vision_config.deepstack_visual_indexes holds " + std::to_string(b) +
                                    " twice");
  }
  return c;
}

}  // namespace gmod

#include "model/qwen2_5_vl_config.h"

#include <nlohmann/json.hpp>
#include <numeric>
#include <stdexcept>

namespace gmod {

namespace {

int64_t positive(const nlohmann::json& j, const char* key, int64_t fallback, const std::string& where) {
  if (!j.contains(key)) return fallback;
  const auto v = j.at(key).get<int64_t>();
  if (v <= 0)
    throw std::invalid_argument(where + ": vision_config." + key + " must be positive, got " +
                                std::to_string(v));
  return v;
}

// The text model's fields: text_config when the file has one, else the top level (the published checkpoints).
const nlohmann::json& text_part(const nlohmann::json& config) {
  return config.contains("text_config") && config.at("text_config").is_object() ? config.at("text_config")
                                                                                : config;
}

const nlohmann::json* rope_object(const nlohmann::json& j) {
  for (const char* key : {"rope_parameters", "rope_scaling"})
    if (j.contains(key) && j.at(key).is_object() && j.at(key).contains("mrope_section")) return &j.at(key);
  return nullptr;
}

}  // namespace

Qwen25VisionConfig Qwen25VisionConfig::from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw std::invalid_argument(where + ": vision_config is not an object");
  Qwen25VisionConfig c;
  c.depth = positive(j, "depth", c.depth, where);
  c.hidden_size = positive(j, "hidden_size", c.hidden_size, where);
  c.intermediate_size = positive(j, "intermediate_size", c.intermediate_size, where);
  c.num_heads = positive(j, "num_heads", c.num_heads, where);
  c.in_channels = positive(j, j.contains("in_chans") ? "in_chans" : "in_channels", c.in_channels, where);
  c.patch_size = positive(j, "patch_size", c.patch_size, where);
  c.temporal_patch_size = positive(j, "temporal_patch_size", c.temporal_patch_size, where);
  c.spatial_merge_size = positive(j, "spatial_merge_size", c.spatial_merge_size, where);
  c.window_size = positive(j, "window_size", c.window_size, where);
  c.out_hidden_size = positive(j, "out_hidden_size", c.out_hidden_size, where);
  c.tokens_per_second = positive(j, "tokens_per_second", c.tokens_per_second, where);
  if (j.contains("fullatt_block_indexes"))
    c.fullatt_block_indexes = j.at("fullatt_block_indexes").get<std::vector<int64_t>>();
  if (j.contains("initializer_range")) c.initializer_range = j.at("initializer_range").get<double>();
  if (j.contains("hidden_act")) c.hidden_act = j.at("hidden_act").get<std::string>();
  if (j.contains("rope_parameters") && j.at("rope_parameters").is_object() &&
      j.at("rope_parameters").contains("rope_theta"))
    c.rope_theta = j.at("rope_parameters").at("rope_theta").get<double>();
  if (c.hidden_act != "silu" && c.hidden_act != "gelu")
    throw std::invalid_argument(where + ": vision_config.hidden_act '" + c.hidden_act +
                                "' is not supported (silu, gelu)");
  if (c.hidden_size % c.num_heads != 0 || c.head_dim() % 4 != 0)
    throw std::invalid_argument(where + ": vision_config hidden_size " + std::to_string(c.hidden_size) +
                                " / num_heads " + std::to_string(c.num_heads) +
                                " must be a head size divisible by 4 (2-D rotary)");
  if (c.window_units() < 1)
    throw std::invalid_argument(where + ": vision_config.window_size " + std::to_string(c.window_size) +
                                " is smaller than one merge block (spatial_merge_size * patch_size)");
  for (auto i : c.fullatt_block_indexes)
    if (i < 0 || i >= c.depth)
      throw std::invalid_argument(where + ": vision_config.fullatt_block_indexes holds " + std::to_string(i) +
                                  ", outside depth " + std::to_string(c.depth));
  return c;
}

MRopeConfig MRopeConfig::from_json(const nlohmann::json& config, const std::string& where) {
  MRopeConfig c;
  const auto& text = text_part(config);
  auto field = [&](const char* key) -> const nlohmann::json& {
    if (config.contains(key)) return config.at(key);
    if (text.contains(key)) return text.at(key);
    throw std::invalid_argument(where + ": no " + key);
  };
  c.image_token_id = field("image_token_id").get<int64_t>();
  c.video_token_id = field("video_token_id").get<int64_t>();
  if (!config.contains("vision_config")) throw std::invalid_argument(where + ": no vision_config");
  const auto& v = config.at("vision_config");
  c.spatial_merge_size = v.value("spatial_merge_size", c.spatial_merge_size);
  c.tokens_per_second = v.value("tokens_per_second", c.tokens_per_second);
  const nlohmann::json* rope = rope_object(text);
  if (!rope) rope = rope_object(config);
  if (!rope) throw std::invalid_argument(where + ": no mrope_section in rope_parameters or rope_scaling");
  c.mrope_section = rope->at("mrope_section").get<std::vector<int64_t>>();
  if (rope->contains("mrope_interleaved")) c.interleaved = rope->at("mrope_interleaved").get<bool>();
  if (rope->contains("rope_theta"))
    c.rope_theta = rope->at("rope_theta").get<double>();
  else if (text.contains("rope_theta"))
    c.rope_theta = text.at("rope_theta").get<double>();
  const auto hidden = text.at("hidden_size").get<int64_t>(),
             heads = text.at("num_attention_heads").get<int64_t>();
  c.head_dim = text.contains("head_dim") && !text.at("head_dim").is_null()
                   ? text.at("head_dim").get<int64_t>()
                   : hidden / heads;
  const int64_t sum = std::accumulate(c.mrope_section.begin(), c.mrope_section.end(), int64_t{0});
  if (c.mrope_section.size() != 3 || sum * 2 != c.head_dim)
    throw std::invalid_argument(where + ": mrope_section must be 3 sections summing to head_dim / 2 = " +
                                std::to_string(c.head_dim / 2) + ", sums to " + std::to_string(sum));
  return c;
}

}  // namespace gmod

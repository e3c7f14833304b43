// LLaVA-NeXT config fields (see llava_next_config.h).
#include "model/llava_next_config.h"

#include <cctype>
#include <nlohmann/json.hpp>

namespace gmod {
namespace {

// transformers' LlavaNextConfig default (LLaVA-v1.6's list), (height, width).
const std::vector<std::array<int, 2>> kDefaultPinpoints = {
    {336, 672}, {672, 336}, {672, 672}, {1008, 336}, {336, 1008}};

// A list of pairs, or the original code's Python text of one ("[(336, 672), (672, 336), ...]"): the pairs as
// written. False when it is neither.
bool read_pairs(const nlohmann::json& v, std::vector<std::array<int, 2>>& out) {
  std::vector<int64_t> flat;
  if (v.is_array()) {
    for (const auto& p : v) {
      if (!p.is_array() || p.size() != 2 || !p[0].is_number_integer() || !p[1].is_number_integer()) return false;
      flat.push_back(p[0].get<int64_t>());
      flat.push_back(p[1].get<int64_t>());
    }
  } else if (v.is_string()) {
    const std::string s = v.get<std::string>();
    for (size_t i = 0; i < s.size();) {
      if (std::isdigit(static_cast<unsigned char>(s[i]))) {
        size_t j = i;
        while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
        if (j - i > 6) return false;
        flat.push_back(std::stoll(s.substr(i, j - i)));
        i = j;
      } else {
        if (std::string("[](), ").find(s[i]) == std::string::npos) return false;
        ++i;
      }
    }
  } else {
    return false;
  }
  if (flat.empty() || flat.size() % 2) return false;
  for (size_t i = 0; i < flat.size(); i += 2)
    out.push_back({static_cast<int>(flat[i]), static_cast<int>(flat[i + 1])});
  return true;
}

}  // namespace

bool original_config_is_anyres(const nlohmann::json& j) {
  const auto str = [&](const char* key) {
    return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
  };
  return str("image_aspect_ratio").rfind("anyres", 0) == 0 || str("mm_patch_merge_type").rfind("spatial", 0) == 0;
}

void parse_llava_next_fields(const nlohmann::json& j, const std::string& where, bool original, LlavaConfig& c,
                             std::vector<std::string>& errors) {
  AnyresConfig a;
  a.unpad_truncates = original;
  if (original) {
    const std::string aspect = j.value("image_aspect_ratio", std::string()),
                      merge = j.value("mm_patch_merge_type", std::string("flat"));
    if (aspect != "anyres")
      errors.push_back(where + "image_aspect_ratio '" + aspect + "' is not supported with mm_patch_merge_type '" +
                       merge + "' (LLaVA-NeXT: 'anyres'; 'anyres_max_N' is OneVision's)");
    if (merge != "spatial_unpad")
      errors.push_back(where + "mm_patch_merge_type '" + merge +
                       "' is not supported with AnyRes (LLaVA-NeXT: 'spatial_unpad')");
  }
  if (!j.contains("image_grid_pinpoints") || j["image_grid_pinpoints"].is_null()) {
    if (original) errors.push_back(where + "missing field 'image_grid_pinpoints' (AnyRes)");
    else a.pinpoints = kDefaultPinpoints;
  } else if (!read_pairs(j["image_grid_pinpoints"], a.pinpoints)) {
    errors.push_back(where + "field 'image_grid_pinpoints' must be a list of [" +
                     (original ? "width, height" : "height, width") + "] pairs, got " +
                     j["image_grid_pinpoints"].dump());
  }
  if (original)  // the original code's pairs are (width, height): gmod keeps (height, width), in the same order
    for (auto& p : a.pinpoints) std::swap(p[0], p[1]);
  if (!c.vision) {
    errors.push_back(where + "AnyRes needs the CLIP vision tower");
  } else {
    const int tile = c.vision->image_size;
    for (const auto& p : a.pinpoints)
      if (p[0] <= 0 || p[1] <= 0 || tile <= 0 || p[0] % tile || p[1] % tile) {
        errors.push_back(where + "image_grid_pinpoints entry (height " + std::to_string(p[0]) + ", width " +
                         std::to_string(p[1]) + ") is not a positive multiple of the tower's image_size " +
                         std::to_string(tile));
        break;
      }
  }
  // The tiles' patch features are laid out on the grid, so they must be patches only (transformers cannot
  // reshape them with the class token either).
  if (c.vision_feature_select_strategy != "default")
    errors.push_back(where + "AnyRes needs vision_feature_select_strategy 'default' (mm_vision_select_feature "
                     "'patch'), got '" + c.vision_feature_select_strategy + "'");
  c.anyres = a;
}

void llava_next_fields_to_json(const LlavaConfig& c, bool original, nlohmann::json& j) {
  if (!c.anyres) return;
  nlohmann::json pins = nlohmann::json::array();
  for (const auto& p : c.anyres->pinpoints)
    pins.push_back(original ? nlohmann::json{p[1], p[0]} : nlohmann::json{p[0], p[1]});
  j["image_grid_pinpoints"] = pins;
  if (!original) {
    j["architectures"] = {"LlavaNextForConditionalGeneration"};
    j["model_type"] = "llava_next";
    return;
  }
  const LlmFamily f = c.text.family;
  j["model_type"] = f == LlmFamily::kMistral ? "llava_mistral" : f == LlmFamily::kQwen2 ? "llava_qwen" : "llava_llama";
  j["architectures"] = {f == LlmFamily::kMistral ? "LlavaMistralForCausalLM"
                        : f == LlmFamily::kQwen2 ? "LlavaQwenForCausalLM"
                                                 : "LlavaLlamaForCausalLM"};
  j["image_aspect_ratio"] = "anyres";
  j["mm_patch_merge_type"] = "spatial_unpad";
}

}  // namespace gmod

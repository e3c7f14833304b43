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

// transformers' LlavaOnevisionConfig default: 384-px tiles, 1 to 6 of them each way, (height, width), rows first.
std::vector<std::array<int, 2>> onevision_default_pinpoints() {
  std::vector<std::array<int, 2>> p;
  for (int h = 1; h <= 6; ++h)
    for (int w = 1; w <= 6; ++w) p.push_back({384 * h, 384 * w});
  return p;
}

// "anyres_max_N" -> N (> 0); 0 when the text is anything else.
int parse_anyres_max(const std::string& s) {
  const std::string prefix = "anyres_max_";
  if (s.size() <= prefix.size() || s.size() > prefix.size() + 6 || s.compare(0, prefix.size(), prefix) != 0) return 0;
  for (size_t i = prefix.size(); i < s.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return 0;
  return std::stoi(s.substr(prefix.size()));
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
  const bool onevision = !original && j.value("model_type", std::string()) == "llava_onevision";
  if (onevision) {
    std::string aspect = "anyres_max_9";  // LlavaOnevisionConfig's default
    if (j.contains("vision_aspect_ratio") && !j["vision_aspect_ratio"].is_null()) {
      if (j["vision_aspect_ratio"].is_string()) aspect = j["vision_aspect_ratio"].get<std::string>();
      else aspect = j["vision_aspect_ratio"].dump();
    }
    a.max_patches = parse_anyres_max(aspect);
    a.video_token_id = 151647;  // LlavaOnevisionConfig's default video_token_index
    if (j.contains("video_token_index") && j["video_token_index"].is_number_integer())
      a.video_token_id = j["video_token_index"].get<int>();
    else if (j.contains("video_token_id") && j["video_token_id"].is_number_integer())
      a.video_token_id = j["video_token_id"].get<int>();
    if (a.max_patches <= 0)
      errors.push_back(where + "vision_aspect_ratio '" + aspect + "' is not supported (LLaVA-OneVision: "
                       "'anyres_max_N' with N > 0)");
  }
  if (!j.contains("image_grid_pinpoints") || j["image_grid_pinpoints"].is_null()) {
    if (original) errors.push_back(where + "missing field 'image_grid_pinpoints' (AnyRes)");
    else a.pinpoints = onevision ? onevision_default_pinpoints() : kDefaultPinpoints;
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
  // The tiles' patch features are laid out on the grid, so they must be the patches, all of them (transformers
  // cannot reshape them otherwise either): CLIP without its class token ('default'), SigLIP whole ('full').
  const std::string patches_only = c.vision && c.vision->siglip() ? "full" : "default";
  if (c.vision_feature_select_strategy != patches_only)
    errors.push_back(where + "AnyRes with a " + (c.vision && c.vision->siglip() ? "SigLIP" : "CLIP") +
                     " tower needs vision_feature_select_strategy '" + patches_only +
                     "' (its patch tokens, all of them), got '" + c.vision_feature_select_strategy + "'");
  c.anyres = a;
}

void llava_next_fields_to_json(const LlavaConfig& c, bool original, nlohmann::json& j) {
  if (!c.anyres) return;
  nlohmann::json pins = nlohmann::json::array();
  for (const auto& p : c.anyres->pinpoints)
    pins.push_back(original ? nlohmann::json{p[1], p[0]} : nlohmann::json{p[0], p[1]});
  j["image_grid_pinpoints"] = pins;
  if (!original) {
    const bool onevision = c.anyres->max_patches > 0;
    j["architectures"] = {onevision ? "LlavaOnevisionForConditionalGeneration" : "LlavaNextForConditionalGeneration"};
    j["model_type"] = onevision ? "llava_onevision" : "llava_next";
    if (onevision) j["vision_aspect_ratio"] = "anyres_max_" + std::to_string(c.anyres->max_patches);
    if (onevision && c.anyres->video_token_id >= 0) j["video_token_index"] = c.anyres->video_token_id;
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

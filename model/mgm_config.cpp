#include "model/mgm_config.h"

#include <nlohmann/json.hpp>

#include "model/llava_hr_config.h"

namespace gmod {
namespace {

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

std::string last_component(std::string s) {
  while (!s.empty() && s.back() == '/') s.pop_back();
  const auto slash = s.rfind('/');
  return slash == std::string::npos ? s : s.substr(slash + 1);
}

}  // namespace

std::optional<ConvNextConfig> mgm_aux_preset(const std::string& name) {
  // MGM's OpenCLIPVisionTower.load_model tests the path it was given; only the directory name matters here.
  const std::string n = last_component(name);
  if (!contains(n, "convnext")) return std::nullopt;
  ConvNextConfig c;  // convnext_large (timm), dims 192..1536
  if (contains(n, "large") && contains(n, "d-320")) return c;
  if (contains(n, "base") && contains(n, "w-320")) {
    c.dims = {128, 256, 512, 1024};
    return c;
  }
  if (contains(n, "xxlarge")) return convnext_preset("convnext_xxlarge");
  return std::nullopt;
}

void parse_mgm_fields(const nlohmann::json& j, const std::string& where, LlavaConfig& c,
                      std::vector<std::string>& errors) {
  MgmConfig m;
  auto get_bool = [&](const char* key, bool& out) {
    if (!j.contains(key) || j[key].is_null()) return;
    if (!j[key].is_boolean())
      errors.push_back(where + "field '" + key + "' must be true or false, got " + j[key].dump());
    else
      out = j[key].get<bool>();
  };
  auto get_int = [&](const char* key, int& out, bool required) {
    if (!j.contains(key) || j[key].is_null()) {
      if (required) errors.push_back(where + "missing field '" + key + "'");
      return false;
    }
    if (!j[key].is_number_integer() || j[key].get<int64_t>() <= 0 || j[key].get<int64_t>() > (1 << 16)) {
      errors.push_back(where + "field '" + key + "' must be a positive integer, got " + j[key].dump());
      return false;
    }
    out = int(j[key].get<int64_t>());
    return true;
  };
  if (!j["mm_vision_tower_aux"].is_string()) {
    errors.push_back(where + "field 'mm_vision_tower_aux' must be a string, got " +
                     j["mm_vision_tower_aux"].dump());
  } else {
    m.aux_name = j["mm_vision_tower_aux"].get<std::string>();
  }
  const bool sized = get_int("image_size_aux", m.image_size_aux, true);
  get_int("image_grid", m.image_grid, false);
  get_bool("image_global", m.image_global);
  get_bool("optimize_vision_tower", m.optimize_vision_tower);
  get_bool("optimize_vision_tower_aux", m.optimize_vision_tower_aux);
  bool shape_known = true;
  if (j.contains("vision_config_aux") && j["vision_config_aux"].is_object()) {
    parse_convnext_shape(j["vision_config_aux"], where + "vision_config_aux: ", m.aux, errors);
  } else if (j.contains("vision_config_aux") && !j["vision_config_aux"].is_null()) {
    errors.push_back(where + "field 'vision_config_aux' must be an object");
  } else if (auto p = mgm_aux_preset(m.aux_name)) {
    m.aux = *p;
  } else if (contains(last_component(m.aux_name), "openai")) {
    shape_known = false;
    errors.push_back(where + "mm_vision_tower_aux '" + m.aux_name +
                     "' is a CLIP ViT; gmod's MGM tower takes an OpenCLIP ConvNeXt as its auxiliary tower");
  } else {
    shape_known = false;
    errors.push_back(
        where + "unknown mm_vision_tower_aux '" + m.aux_name +
        "' (known: MGM's OpenCLIP ConvNeXts, a directory named like "
        "openclip-convnext-large-d-320-*, openclip-convnext-base-w-320-*, openclip-convnext-xxlarge-*; "
        "or embed its shape as 'vision_config_aux')");
  }
  if (shape_known && j.contains("mm_hidden_size_aux") && j["mm_hidden_size_aux"].is_number_integer() &&
      j["mm_hidden_size_aux"].get<int64_t>() != m.aux_channels())
    errors.push_back(where + "mm_hidden_size_aux " + j["mm_hidden_size_aux"].dump() +
                     " is not the ConvNeXt's summed stage widths " + std::to_string(m.aux_channels()) + " (" +
                     m.aux_name + ")");
  if (m.image_global && m.image_grid < 2)
    errors.push_back(where + "image_global needs image_grid >= 2 (MGM adds the global image only to a grid)");
  if (c.vision_feature_select_strategy != "default")
    errors.push_back(where +
                     "mm_vision_select_feature must be 'patch' for MGM (patch info mining needs a square "
                     "grid of CLIP patch tokens)");
  if (c.vision && sized) {
    const ClipVisionConfig& v = *c.vision;
    const int g = v.patch_size > 0 ? v.image_size / v.patch_size : 0;
    const int s0 =
        m.image_size_aux / m.aux.patch_size;  // the ConvNeXt stem's grid, which every stage is resized to
    if (m.image_size_aux % 32 != 0)
      errors.push_back(where + "image_size_aux " + std::to_string(m.image_size_aux) +
                       " is not a multiple of 32 (the ConvNeXt downsamples by 32)");
    else if (g <= 0 || s0 % m.image_grid != 0 || (s0 / m.image_grid) % g != 0)
      errors.push_back(where + "image_size_aux " + std::to_string(m.image_size_aux) + ": the ConvNeXt grid " +
                       std::to_string(s0) + " (image_size_aux / 4) split in image_grid " +
                       std::to_string(m.image_grid) + " is not a multiple of the CLIP grid " +
                       std::to_string(g) + " (each CLIP patch mines a square high-resolution region)");
    const int64_t tokens = int64_t(v.num_patches()) * m.clip_images();
    if (c.text.max_position_embeddings > 0 && tokens >= c.text.max_position_embeddings)
      errors.push_back(where + "one image takes " + std::to_string(tokens) +
                       " positions, not fewer than max_position_embeddings (" +
                       std::to_string(c.text.max_position_embeddings) + ")");
  }
  c.mgm = m;
}

void mgm_fields_to_json(const LlavaConfig& c, nlohmann::json& j) {
  if (!c.mgm) return;
  const MgmConfig& m = *c.mgm;
  j["mm_vision_tower_aux"] = m.aux_name;
  j["image_size_aux"] = m.image_size_aux;
  j["image_grid"] = m.image_grid;
  j["image_global"] = m.image_global;
  j["optimize_vision_tower"] = m.optimize_vision_tower;
  j["optimize_vision_tower_aux"] = m.optimize_vision_tower_aux;
  j["mm_hidden_size_aux"] = m.aux_channels();
  j["vision_config_aux"] = convnext_shape_to_json(m.aux);
}

}  // namespace gmod

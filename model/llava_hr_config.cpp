#include "model/llava_hr_config.h"

#include <cstdlib>
#include <nlohmann/json.hpp>

namespace gmod {
namespace {

std::string list_str(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

template <typename T>
void read(const nlohmann::json& j, const char* key, T& out, const std::string& where,
          std::vector<std::string>& errors, const char* expected) {
  if (!j.contains(key) || j[key].is_null()) return;
  const auto& v = j[key];
  bool ok = false;
  if constexpr (std::is_same_v<T, int>)
    ok = v.is_number_integer() && std::llabs(v.get<int64_t>()) < (1 << 20);
  else if constexpr (std::is_same_v<T, double>)
    ok = v.is_number();
  else if constexpr (std::is_same_v<T, bool>)
    ok = v.is_boolean();
  else if constexpr (std::is_same_v<T, std::string>)
    ok = v.is_string();
  else if constexpr (std::is_same_v<T, std::vector<int>>) {
    ok = v.is_array();
    for (const auto& e : v)
      ok = ok && e.is_number_integer() && e.get<int64_t>() > 0 && e.get<int64_t>() < (1 << 20);
  }
  if (!ok) {
    errors.push_back(where + "field '" + key + "' must be " + expected + ", got " + v.dump());
    return;
  }
  out = v.get<T>();
}

}  // namespace

std::optional<ConvNextConfig> convnext_preset(const std::string& name) {
  const std::string arch = name.substr(0, name.find('.'));
  ConvNextConfig c;  // defaults: convnext_large_mlp
  if (arch == "convnext_large_mlp" || arch == "convnext_large") return c;
  if (arch == "convnext_xxlarge") {
    c.depths = {3, 4, 30, 3};
    c.dims = {384, 768, 1536, 3072};
    c.norm_eps = 1e-5;
    return c;
  }
  return std::nullopt;
}

void parse_convnext_shape(const nlohmann::json& s, const std::string& w, ConvNextConfig& out,
                          std::vector<std::string>& errors) {
  ConvNextConfig& c = out;
  read(s, "depths", c.depths, w, errors, "a list of positive integers");
  read(s, "dims", c.dims, w, errors, "a list of positive integers");
  read(s, "in_chans", c.in_chans, w, errors, "a positive integer");
  read(s, "patch_size", c.patch_size, w, errors, "a positive integer");
  read(s, "kernel_size", c.kernel_size, w, errors, "a positive odd integer");
  read(s, "mlp_ratio", c.mlp_ratio, w, errors, "a positive integer");
  read(s, "norm_eps", c.norm_eps, w, errors, "a number");
  read(s, "ls_init_value", c.ls_init_value, w, errors, "a number");
  read(s, "initializer_range", c.initializer_range, w, errors, "a number");
  if (c.depths.size() != 4 || c.dims.size() != 4)
    errors.push_back(w + "depths " + list_str(c.depths) + " and dims " + list_str(c.dims) +
                     " must have four entries each (four stages)");
  if (c.kernel_size <= 0 || c.kernel_size % 2 != 1) errors.push_back(w + "kernel_size must be positive and odd");
  if (c.in_chans <= 0 || c.mlp_ratio <= 0) errors.push_back(w + "in_chans and mlp_ratio must be positive");
  if (c.patch_size != 4) errors.push_back(w + "patch_size must be 4 (the stride-4 stem LLaVA-HR and MGM assume)");
  if (!(c.norm_eps > 0)) errors.push_back(w + "norm_eps must be positive");
}

nlohmann::json convnext_shape_to_json(const ConvNextConfig& c) {
  return {{"depths", c.depths},         {"dims", c.dims},         {"in_chans", c.in_chans},
          {"patch_size", c.patch_size}, {"kernel_size", c.kernel_size}, {"mlp_ratio", c.mlp_ratio},
          {"norm_eps", c.norm_eps},     {"ls_init_value", c.ls_init_value},
          {"initializer_range", c.initializer_range}};
}

void parse_llava_hr_fields(const nlohmann::json& j, const std::string& where, LlavaConfig& c,
                           std::vector<std::string>& errors) {
  MultipathConfig m;
  bool freeze = true;  // LLaVA-HR's ModelArguments default
  read(j, "freeze_vision", freeze, where, errors, "true or false");
  m.stitch = !freeze;
  if (!j.contains("input_image_size") || j["input_image_size"].is_null())
    errors.push_back(where + "missing field 'input_image_size' (LLaVA-HR's image size, e.g. 1024)");
  read(j, "input_image_size", m.input_image_size, where, errors, "a positive integer");
  if (m.input_image_size <= 0 || m.input_image_size % 32 != 0)
    errors.push_back(where + "input_image_size " + std::to_string(m.input_image_size) +
                     " is not a positive multiple of 32 (the ConvNeXt path downsamples by 32)");
  if (!j.contains("vision_tower_slow") || !j["vision_tower_slow"].is_string())
    errors.push_back(where +
                     "missing string 'vision_tower_slow' (the ConvNeXt, e.g. "
                     "convnext_large_mlp.clip_laion2b_ft_320)");
  else
    m.slow_name = j["vision_tower_slow"].get<std::string>();
  if (j.contains("vision_config_slow") && j["vision_config_slow"].is_object()) {
    parse_convnext_shape(j["vision_config_slow"], where + "vision_config_slow: ", m.slow, errors);
  } else if (j.contains("vision_config_slow") && !j["vision_config_slow"].is_null()) {
    errors.push_back(where + "field 'vision_config_slow' must be an object");
  } else if (auto p = convnext_preset(m.slow_name)) {
    m.slow = *p;
  } else {
    errors.push_back(
        where + "unknown vision_tower_slow '" + m.slow_name +
        "' (known: convnext_large_mlp.*, convnext_xxlarge.*; or embed its shape as 'vision_config_slow')");
  }
  int select_layer = -2;
  read(j, "mm_vision_select_layer", select_layer, where, errors, "an integer");
  if (j.contains("mm_vision_select_layer") && j["mm_vision_select_layer"].is_number_integer() &&
      j["mm_vision_select_layer"].get<int64_t>() > 100)
    errors.push_back(where + "mm_vision_select_layer > 100 (multi-layer CLIP features) is not supported");
  if (c.vision) {
    const ClipVisionConfig& v = *c.vision;
    if (v.num_hidden_layers % 4 != 0)
      errors.push_back(where + "vision_config: num_hidden_layers " + std::to_string(v.num_hidden_layers) +
                       " is not a multiple of 4 (LLaVA-HR splits the CLIP layers in four quarters)");
    if (m.input_image_size > 0 && m.input_image_size % 32 == 0 && v.patch_size > 0) {
      const int fast = m.fast_image_size();
      const int fg = fast / v.patch_size, sg = m.input_image_size / 32;
      if (fast % v.patch_size != 0)
        errors.push_back(where + "the fast path's image size " + std::to_string(fast) +
                         " (max(input_image_size / 32 * 14, 336)) is not a multiple of the CLIP patch size " +
                         std::to_string(v.patch_size));
      else if (fg % sg != 0 && sg % fg != 0)
        errors.push_back(where + "the CLIP grid " + std::to_string(fg) + "x" + std::to_string(fg) +
                         " and the ConvNeXt grid " + std::to_string(sg) + "x" + std::to_string(sg) +
                         " (input_image_size / 32) do not divide one another; LLaVA-HR pools or upsamples "
                         "between them by an integer factor");
    }
  }
  c.multipath = m;
}

void llava_hr_fields_to_json(const LlavaConfig& c, nlohmann::json& j) {
  if (!c.multipath) return;
  const MultipathConfig& m = *c.multipath;
  j["is_multipath_encoder"] = true;
  j["vision_tower_slow"] = m.slow_name;
  j["input_image_size"] = m.input_image_size;
  j["freeze_vision"] = !m.stitch;
  j["vision_config_slow"] = convnext_shape_to_json(m.slow);
}

}  // namespace gmod

// Mini-Gemini's (MGM, dvlab-research/MGM) config.json fields (MGMLlamaForCausalLM, model_type "mgm"):
// mm_vision_tower_aux (the OpenCLIP ConvNeXt whose name decides its shape, as MGM's OpenCLIPVisionTower does,
// or gmod's embedded `vision_config_aux` object for any size), image_size_aux, image_grid, image_global,
// optimize_vision_tower, optimize_vision_tower_aux. Parsed into LlavaConfig::mgm, every problem collected in
// one list, like model/config.h.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"

namespace gmod {

// The ConvNeXt an MGM mm_vision_tower_aux name stands for (MGM's rule: "convnext" and "large" with "d-320",
// "base" with "w-320", or "xxlarge", in the directory name), or nullopt.
std::optional<ConvNextConfig> mgm_aux_preset(const std::string& name);

// Reads the MGM fields of `j` into c.mgm (c.vision, the low-resolution CLIP, and c.text are already parsed).
// Problems are appended to `errors`, each starting with `where`.
void parse_mgm_fields(const nlohmann::json& j, const std::string& where, LlavaConfig& c,
                      std::vector<std::string>& errors);

// The same fields back (for writing an MGM config.json), with mm_hidden_size_aux and vision_config_aux.
void mgm_fields_to_json(const LlavaConfig& c, nlohmann::json& j);

}  // namespace gmod

// LLaVA-HR's config.json fields (LlavaLlamaForCausalLM with `is_multipath_encoder: true`): vision_tower_slow,
// input_image_size, freeze_vision, and the ConvNeXt shape, either a known timm model name
// (convnext_large_mlp.*, convnext_xxlarge.*) or gmod's embedded `vision_config_slow` object (any size:
// depths, dims, patch_size, kernel_size, mlp_ratio, norm_eps, ls_init_value, in_chans). Parsed into
// LlavaConfig::multipath, every problem collected in one list, like model/config.h.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"

namespace gmod {

// The timm ConvNeXt a vision_tower_slow name stands for (the part before '.' decides), or nullopt.
std::optional<ConvNextConfig> convnext_preset(const std::string& name);

// A ConvNeXt shape object (gmod's `vision_config_slow` / MGM's `vision_config_aux`: depths, dims, in_chans,
// patch_size, kernel_size, mlp_ratio, norm_eps, ls_init_value, initializer_range; absent keys keep `out`'s
// values) into `out`; problems appended to `errors`, each starting with `where`. And the same object back.
void parse_convnext_shape(const nlohmann::json& j, const std::string& where, ConvNextConfig& out,
                          std::vector<std::string>& errors);
nlohmann::json convnext_shape_to_json(const ConvNextConfig& c);

// Reads the multipath fields of an LLaVA-HR config.json `j` into c.multipath (c.vision, the fast CLIP path,
// is already parsed). Problems are appended to `errors`, each starting with `where`.
void parse_llava_hr_fields(const nlohmann::json& j, const std::string& where, LlavaConfig& c,
                           std::vector<std::string>& errors);

// The same fields back (for writing a LLaVA-HR config.json).
void llava_hr_fields_to_json(const LlavaConfig& c, nlohmann::json& j);

}  // namespace gmod

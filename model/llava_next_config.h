// LLaVA-NeXT's (llava-v1.6) config.json fields, in both layouts it is published in: transformers'
// LlavaNextForConditionalGeneration (model_type "llava_next": `image_grid_pinpoints` as (height, width) pairs) and
// the original LLaVA code's LlavaLlamaForCausalLM / LlavaMistralForCausalLM (model_type "llava_llama" /
// "llava_mistral" with `image_aspect_ratio: "anyres"`, `mm_patch_merge_type: "spatial_unpad"` and
// `image_grid_pinpoints` as (width, height) pairs, a list or its Python text). Parsed into LlavaConfig::anyres
// (model/anyres_grid.h), every problem collected in one list, like model/config.h. transformers'
// LlavaOnevisionForConditionalGeneration (model_type "llava_onevision") is the transformers layout plus
// `vision_aspect_ratio: "anyres_max_N"` (AnyresConfig::max_patches; default anyres_max_9) and its own default
// pinpoints (384-px tiles, 1 to 6 each way); the original code's OneVision layout (llava_qwen) is not read.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/config.h"

namespace gmod {

// True when an original-layout config asks for AnyRes (image_aspect_ratio "anyres" or mm_patch_merge_type
// starting with "spatial").
bool original_config_is_anyres(const nlohmann::json& j);

// Reads the AnyRes fields of `j` into c.anyres (c.vision and c.text are already parsed). `original`: the original
// LLaVA code's layout (pinpoints (width, height), unpad truncating); else transformers' (pinpoints (height, width),
// a missing list meaning transformers' default, unpad rounding to 7 decimals first). Problems are appended to
// `errors`, each starting with `where`.
void parse_llava_next_fields(const nlohmann::json& j, const std::string& where, bool original, LlavaConfig& c,
                             std::vector<std::string>& errors);

// The same fields back into a config.json being written: the original layout's model_type (llava_llama,
// llava_mistral, llava_qwen), image_aspect_ratio, mm_patch_merge_type and (width, height) pinpoints, or
// transformers' architecture, model_type llava_next (llava_onevision with its vision_aspect_ratio when
// max_patches > 0) and (height, width) pinpoints. Nothing without c.anyres.
void llava_next_fields_to_json(const LlavaConfig& c, bool original, nlohmann::json& j);

}  // namespace gmod

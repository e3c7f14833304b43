// The config.json readers of the Qwen vision-language families (Qwen2.5-VL, Qwen3-VL): their text model, M-RoPE
// and vision encoder settings into a LlavaConfig. Called by parse_model_config (model/config.cpp) by model_type;
// every problem is appended to `errors`, prefixed by `where`.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/config.h"

namespace gmod {

// Qwen3-VL's text model is the Qwen family's (its chat template, its vocabulary) with q_norm / k_norm and no default
// q/k/v biases: LlamaConfig::qk_norm within LlmFamily::kQwen2. Text-only Qwen3 (model_type qwen3) is the same
// decoder but has no parity check of its own yet, so it stays refused.
inline bool is_qwen3_type(const std::string& type) { return type == "qwen3_vl" || type == "qwen3_vl_text"; }

void parse_qwen2_5_vl(const nlohmann::json& j, const std::string& where, LlavaConfig& c,
                      std::vector<std::string>& errors);
void parse_qwen3_vl(const nlohmann::json& j, const std::string& where, LlavaConfig& c,
                    std::vector<std::string>& errors);

}  // namespace gmod

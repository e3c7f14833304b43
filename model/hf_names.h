// The one place where Hugging Face parameter names meet gmod's. Reads every layout we meet in the
// wild: plain LLaMA (`model.*`), original LLaVA (`model.mm_projector.{0,2}`,
// `model.vision_tower.vision_tower.vision_model.*`), transformers' LlavaForConditionalGeneration
// (`language_model.model.*`, `multi_modal_projector.*`, `vision_tower[.vision_model].*`) and the
// newer `model.language_model.*` prefixes. Writes the transformers LLaVA layout or the plain LLaMA one.
#pragma once

#include <optional>
#include <string>

namespace gmod {

// gmod name for a checkpoint name; nullopt for names gmod does not hold (e.g. rotary inv_freq).
std::optional<std::string> hf_to_gmod(const std::string& hf_name);

enum class HfLayout { kLlama, kLlava };
std::string gmod_to_hf(const std::string& gmod_name, HfLayout layout);

}  // namespace gmod

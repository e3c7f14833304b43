// The one place where Hugging Face parameter names meet gmod's. Reads every layout we meet in the
// wild: plain LLaMA (`model.*`), original LLaVA (`model.mm_projector.{0,2}`,
// `model.vision_tower.vision_tower.vision_model.*`), transformers' LlavaForConditionalGeneration
// (`language_model.model.*`, `multi_modal_projector.*`, `vision_tower[.vision_model].*`) and the
// newer `model.language_model.*` prefixes, and LLaVA-HR's multipath tower (`model.vision_tower.{fast,slow}_
// vision_tower.vision_tower.*`, `model.vision_tower.align_stages[_latent].*`), and Mini-Gemini's
// (`model.vision_tower_aux.vision_{stem,stages}.*`, `model.vlm_uni_*`). Writes the transformers LLaVA layout,
// the plain LLaMA one, or the original LLaVA code's layout as LLaVA-HR and MGM save it (`model.*`,
// `model.mm_projector.{0,2}.*`, the tower's original names): kLlavaHr, chosen by LlavaConfig::original_layout.
#pragma once

#include <optional>
#include <string>

namespace gmod {

// gmod name for a checkpoint name; nullopt for names gmod does not hold (e.g. rotary inv_freq).
std::optional<std::string> hf_to_gmod(const std::string& hf_name);
// Checkpoint tensors gmod deliberately does not hold, which loaders skip: RoPE inv_freq, and the classifier
// head / norm_pre of LLaVA-HR's ConvNeXt (the tower reads the last stage's map), SigLIP's pooling head.
bool hf_unused(const std::string& hf_name);

// kQwen25VL: Qwen2_5_VLForConditionalGeneration's published checkpoint names, which transformers 5's
// save_pretrained also writes (visual.*, model.* for the text model, lm_head.*).
// kQwen3VL: Qwen3VLForConditionalGeneration's (published and transformers 5's): model.visual.*,
// model.language_model.*, lm_head.*.
enum class HfLayout { kLlama, kLlava, kLlavaHr, kQwen25VL, kQwen3VL };
std::string gmod_to_hf(const std::string& gmod_name, HfLayout layout);

// MoD router tensors. Checkpoints carry one router per MoD layer i as `<layers prefix>.{i}.router.weight`
// (γ-MoD: [2, D], every copy equal; per-layer routers: [1, D]), in any of the layouts above, e.g.
// `language_model.model.layers.3.router.weight` or the official code's `model.layers.3.router.weight`.
// The layer index of such a name, else nullopt.
std::optional<int> hf_router_layer(const std::string& hf_name);
// The name of layer `layer`'s router in `layout` (the reverse of hf_router_layer).
std::string hf_router_name(int layer, HfLayout layout);

}  // namespace gmod

// LoRA adapters in PEFT's on-disk format: a directory with adapter_config.json (peft_type LORA, r,
// lora_alpha, lora_dropout, target_modules, bias) and adapter_model.safetensors whose keys are
//   base_model.model.<transformers module name>.lora_A.weight  [r, in]
//   base_model.model.<transformers module name>.lora_B.weight  [out, r]
// (PeftModel.save_pretrained strips the adapter name "default"). The module names are transformers' in-memory
// ones: LlamaForCausalLM `model.layers.{i}.self_attn.q_proj`, LlavaForConditionalGeneration (transformers 5)
// `model.language_model.layers.{i}...`. peft.PeftModel.from_pretrained(base, dir) loads it.
#pragma once

#include <string>

#include "model/lora.h"

namespace gmod {

// The adapter keys' module prefix for `model` ("base_model.model." + the HF name of "llm.layers..." minus
// ".weight").
std::string peft_module_name(const MultimodalLM& model, const std::string& gmod_module);

// Writes `dir`/adapter_config.json and `dir`/adapter_model.safetensors (adapter weights in their dtype) from
// the adapters attached to `model` with config `c`. `base_model` is recorded as base_model_name_or_path.
void save_peft_adapter(const MultimodalLM& model, const LoraConfig& c, const std::string& dir,
                       const std::string& base_model);

// Reads `dir`/adapter_config.json into a LoraConfig; refuses (naming the file and key) what gmod does not
// build: another peft_type, use_dora, use_rslora, fan_in_fan_out, rank_pattern / alpha_pattern, a regex
// target_modules, bias other than "none".
LoraConfig read_peft_adapter_config(const std::string& dir);

// attach_lora(model, read_peft_adapter_config(dir)) and loads every adapter tensor of
// adapter_model.safetensors; every adapter must be in the file and every file tensor must belong to an
// adapter (errors name the file and key).
LoraAttachment load_peft_adapter(MultimodalLM& model, const std::string& dir);

}  // namespace gmod

// Checkpoints of the original p-MoD code (MCG-NJU/p-MoD) as gmod models: config.json of model_type
// pmod_llava_llama with its flat mod_* keys (mod/pmod.h: pmod_config_from_official) and the weights as its
// PmodLlavaLlamaForCausalLM saves them: an original-LLaVA layout where each MoD layer i wraps the decoder layer
// (model.layers.{i}.decoder_layer.*) and holds its router (model.layers.{i}.router.router.{weight,bias}).
// Both ways: load_pmod_original reads it, save_pmod_original writes it (gmod export --pmod-original).
#pragma once

#include <memory>
#include <string>

#include "model/llava.h"
#include "mod/mod_config.h"

namespace gmod {

// The standard-LLaVA name of an original p-MoD tensor name: model.layers.{i}.decoder_layer.X -> model.layers.{i}.X,
// model.layers.{i}.router.router.X -> model.layers.{i}.router.X (others unchanged); hf_to_gmod reads the result.
std::string pmod_unwrap_name(const std::string& hf_name);

// True when `dir`/config.json names model_type pmod_llava_llama.
bool is_pmod_original(const std::string& dir);

// Loads an original p-MoD directory. `denominator`: the schedule's N (official_31 reproduces what the code trained;
// it equals "depth" on 32-layer LLMs). Every tensor must be used and every parameter filled; errors name the
// file and the tensor.
std::shared_ptr<MultimodalLM> load_pmod_original(const std::string& dir,
                                                 PModDenominator denominator = PModDenominator::kOfficial31,
                                                 at::ScalarType dtype = at::kFloat, at::Device device = at::kCPU);

// Writes `model` (converted with a p-MoD config `mc`) as the original code saves it: config.json of model_type
// pmod_llava_llama (the original LLaVA fields and the flat mod_* keys), model.safetensors under the original names,
// and the CLIP's config.json + preprocessor_config.json in <dir>/clip (what mm_vision_tower names). The original
// hard-codes the schedule's N = 31: a model whose schedule uses another N (pmod_denominator "depth" on an LLM of
// other than 32 layers) is refused, naming both, since the original code would keep other tokens.
void save_pmod_original(const MultimodalLM& model, const MoDConfig& mc, const std::string& dir);

}  // namespace gmod

// Mixture-of-Depths models as Hugging Face checkpoints, both directions. The dense weights use the
// transformers layout of save_pretrained (LlavaForConditionalGeneration, or LlamaForCausalLM without a
// vision tower); the routers are written per MoD layer i as `<layers>.{i}.router.weight`
// (model/hf_names.h: hf_router_name): the γ-MoD shared router [2, D] once per MoD layer, all copies
// equal, as the official checkpoints; Raposo per-layer routers [1, D] each in its layer; A-MoD has no
// tensors. config.json records the MoD config under "mod" (mod/mod_config.h: to_json, which includes
// the official mod_enable and mod_layers_idx).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "model/llava.h"
#include "mod/mod_config.h"

namespace gmod {

// Throws, writing nothing, when a floating-point parameter holds NaN or infinity (a diverged run, a damaged
// source): "<what>: the weights are non-finite in N tensor(s), nothing <verb>:" and the first five tensors
// with their NaN and inf counts. Every command that writes weights calls it (save_mod_pretrained does).
void check_finite_weights(const MultimodalLM& model, const std::string& what,
                          const std::string& verb = "written");

// Writes `dir` (config.json + safetensors). `model` must have been converted with `cfg` (convert_to_mod);
// a model without MoD layers and an empty cfg.mod_layers write a plain dense checkpoint without "mod".
// Non-finite weights are refused before anything is written (check_finite_weights).
void save_mod_pretrained(const MultimodalLM& model, const MoDConfig& cfg, const std::string& dir);

// The MoD config a Hugging Face model directory's config.json records: the "mod" object when it has
// mod_enable = true, else (official γ-MoD configs) top-level mod_enable + mod_layers_idx; nullopt = dense.
// The "mod" object is gmod's own and is validated whole, also with mod_enable = false: an unknown key or a
// bad value is an error naming config.json and the key (the rest of config.json is Hugging Face's: not
// checked here).
std::optional<MoDConfig> read_mod_config(const std::string& dir);

// Loads `dir`: with a MoD config, builds the model, converts it (convert_to_mod) and loads the dense
// weights and the routers (γ: every MoD layer's copy must be present and equal; it goes into the one
// shared router); without one, plain load_pretrained. Accepts every layout hf_to_gmod reads, e.g. the
// official γ-MoD `model.layers.{i}.router.weight`. Errors name the file and the tensors.
std::shared_ptr<MultimodalLM> load_mod_pretrained(const std::string& dir, at::ScalarType dtype = at::kFloat,
                                                  at::Device device = at::kCPU);

}  // namespace gmod

// How a training run turns its config into a model: the MoD conversion the Trainer applies, and the same
// architecture rebuilt from a checkpoint's stored run config (for `gmod export`). One place, so an exported
// checkpoint has exactly the layers and routers that were trained.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "model/llava.h"
#include "model/lora.h"
#include "mod/mod_config.h"
#include "trainer/config/train_config.h"

namespace gmod {

// The model section's architecture: model.path's config.json, or the composition of model.llm/vision/projector.
LlavaConfig run_model_config(const ModelSection& m);
// The model of the section with its weights (model.init = "pretrained": the combined directory, or every part;
// "random": initialised like transformers from init_seed), parameters in `dtype` on the CPU.
std::shared_ptr<MultimodalLM> load_run_model(const ModelSection& m, at::ScalarType dtype);
// Where the tokenizer lives when data.tokenizer is empty (model.path or model.llm), and the directory that may hold
// the image preprocessor_config.json (model.path or model.vision).
std::string default_tokenizer_source(const ModelSection& m);
std::string preprocessor_source(const ModelSection& m);
// One line naming the model for logs ("DIR" or "llm=DIR vision=DIR projector=FILE").
std::string describe_model_source(const ModelSection& m);

// Picks the MoD layers (mod.config.mod_layers when set, else mod.rule; `arank` is called only for rules that
// need per-layer ARank), validates and converts `model` (convert_to_mod). Returns the effective MoDConfig,
// with mod_layers and selection filled in.
MoDConfig convert_for_run(MultimodalLM& model, const ModSection& mod,
                          const std::function<std::vector<double>()>& arank);

// The run's model as it was trained: model.path's config.json, converted to MoD as recorded in `cfg` (a
// checkpoint's stored config has mod.config.mod_layers filled in), parameters in the run's dtype on CPU,
// weights not loaded. `mod_out` receives the effective MoD config (mod_layers empty for a dense run).
// With lora.r > 0 it carries the run's LoRA adapters (attach_run_lora).
std::shared_ptr<MultimodalLM> build_run_model(const TrainConfig& cfg, MoDConfig* mod_out = nullptr);

// The run's LoRA adapters (lora.r > 0) on `model`, after its MoD conversion (γ-MoD's train.py loads the MoD model,
// then get_peft_model), in the model's dtype and device, A initialised from model.init_seed.
LoraAttachment attach_run_lora(MultimodalLM& model, const TrainConfig& cfg);

}  // namespace gmod

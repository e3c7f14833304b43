// How a training run turns its config into a model: the MoD conversion the Trainer applies, and the same
// architecture rebuilt from a checkpoint's stored run config (for `gmod export`). One place, so an exported
// checkpoint has exactly the layers and routers that were trained.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "model/llava.h"
#include "mod/mod_config.h"
#include "trainer/train_config.h"

namespace gmod {

// Picks the MoD layers (mod.config.mod_layers when set, else mod.rule; `arank` is called only for rules that
// need per-layer ARank), validates and converts `model` (convert_to_mod). Returns the effective MoDConfig,
// with mod_layers and selection filled in.
MoDConfig convert_for_run(MultimodalLM& model, const ModSection& mod,
                          const std::function<std::vector<double>()>& arank);

// The run's model as it was trained: model.path's config.json, converted to MoD as recorded in `cfg` (a
// checkpoint's stored config has mod.config.mod_layers filled in), parameters in the run's dtype on CPU,
// weights not loaded. `mod_out` receives the effective MoD config (mod_layers empty for a dense run).
std::shared_ptr<MultimodalLM> build_run_model(const TrainConfig& cfg, MoDConfig* mod_out = nullptr);

}  // namespace gmod

// Which parameters of a run's model train, before any optimizer exists: freeze.* (the tower, the projector,
// the LLM, decoder layer ranges; a frozen tower keeps its adapters, VisionTower::is_adapter) gives each
// parameter its part and frozen flag, and optimizer.groups (trainer/config/param_groups.h) then may freeze
// more and gives every trainable parameter its group. The trainer (freeze_and_count) and `gmod plan` use the
// same two steps.
#pragma once

#include <vector>

#include "model/llava.h"
#include "trainer/config/param_groups.h"
#include "trainer/config/train_config.h"

namespace gmod {

// One entry per model.named_parameters(), in that order: name, numel, part, frozen by freeze.*.
std::vector<ParamGroupInput> param_group_inputs(MultimodalLM& model, const TrainConfig& cfg);

}  // namespace gmod

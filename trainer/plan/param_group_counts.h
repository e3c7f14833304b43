// optimizer.groups in `gmod plan`: the groups resolved against the run's model exactly as the trainer
// resolves them (trainer/param_freeze.h), with each group's parameter counts, and the parameters the groups
// freeze on top of freeze.* (MemoryPlanInputs::frozen_by_groups: no gradient, master or moments for them).
// Glob and regex patterns need the real parameter names, so the model is built without weights: its large
// tensors come from at::empty and are never written, which takes address space but no memory (nothing is
// initialised or loaded).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "trainer/config/param_groups.h"

namespace gmod {

struct TrainConfig;

struct PlanParamGroups {
  ResolvedParamGroups groups;
  // Groups gmod train would refuse (matching no parameter, or only frozen ones), as resolve_param_groups
  // names them: the plan prints them as warnings and plans on (e.g. a lora group, whose adapters this model
  // lacks).
  std::vector<std::string> problems;
  int64_t frozen_by_groups = 0;  // parameters freeze.* leaves trainable and a freeze group freezes
};

// mod_layers: the MoD layers the plan assumes (MemoryPlanInputs::mod_layers; empty = dense).
PlanParamGroups plan_param_groups(const TrainConfig& cfg, const LlavaConfig& model,
                                  const std::vector<int>& mod_layers);

// One line per group: name, where it is configured, lr, weight decay, trainable and frozen parameter counts.
std::string format_param_groups(const ResolvedParamGroups& g);

}  // namespace gmod

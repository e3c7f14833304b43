#include "trainer/plan/param_group_counts.h"

#include <cstdio>

#include "mod/conversion.h"
#include "model/llava.h"
#include "trainer/config/train_config.h"
#include "trainer/param_freeze.h"

namespace gmod {

PlanParamGroups plan_param_groups(const TrainConfig& cfg, const LlavaConfig& model,
                                  const std::vector<int>& mod_layers) {
  MultimodalLM m(model);  // no weights: see the top of the header
  if (!mod_layers.empty()) {
    MoDConfig mc = cfg.mod.config;
    mc.mod_layers = mod_layers;
    convert_to_mod(m, mc);
  }
  const std::vector<ParamGroupInput> inputs = param_group_inputs(m, cfg);
  PlanParamGroups out;
  out.groups = resolve_param_groups(cfg.optimizer, inputs, &out.problems);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!inputs[i].frozen && out.groups.group_of[i] < 0) out.frozen_by_groups += inputs[i].numel;
  return out;
}

std::string format_param_groups(const ResolvedParamGroups& g) {
  std::string s = "parameter groups (optimizer.groups; the first that matches takes a parameter):\n";
  char line[512];
  for (const ResolvedGroup& r : g.groups) {
    if (r.freeze)
      std::snprintf(line, sizeof line, "  %-22s %-30s frozen%35s %14lld frozen\n", r.name.c_str(),
                    r.key.c_str(), "", (long long)r.frozen_params);
    else
      std::snprintf(
          line, sizeof line, "  %-22s %-30s lr %-10.3g wd %-8.3g %14lld trainable in %5lld tensors%s\n",
          r.name.c_str(), r.key.c_str(), r.lr, r.weight_decay, (long long)r.params, (long long)r.tensors,
          r.frozen_params ? (", " + std::to_string(r.frozen_params) + " frozen by freeze.*").c_str() : "");
    s += line;
  }
  return s;
}

}  // namespace gmod

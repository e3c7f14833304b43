#include "trainer/param_freeze.h"

#include <set>
#include <string>

#include "model/lora.h"
#include "model/strings.h"

namespace gmod {
namespace {}  // namespace

std::vector<ParamGroupInput> param_group_inputs(MultimodalLM& model, const TrainConfig& cfg) {
  const int n_layers = model.config.text.num_hidden_layers;
  const auto frozen_layers = parse_layer_ranges(cfg.freeze.llm_layers, n_layers);
  const std::set<int> frozen_set(frozen_layers.begin(), frozen_layers.end());
  std::vector<ParamGroupInput> out;
  for (auto& item : model.named_parameters()) {
    const std::string& name = item.key();
    const bool vision = starts_with(name, "vision.");
    const bool adapter = vision && model.vision->is_adapter(name.substr(7));
    bool frozen;
    // vision.* / projector.* / everything else is the LLM (incl. lm_head and MoD routers).
    if (vision) {
      frozen = cfg.freeze.vision && !adapter;
    } else if (starts_with(name, "projector.")) {
      frozen = cfg.freeze.projector;
    } else {
      // LoRA: the LLM's own weights are frozen, its adapters and MoD routers train.
      frozen = cfg.freeze.llm ||
               (cfg.lora.enabled() && !is_lora_parameter(name) && name.find("router") == std::string::npos);
      if (!frozen && starts_with(name, "llm.layers.")) {
        const int layer = std::stoi(name.substr(11, name.find('.', 11) - 11));
        frozen = frozen_set.count(layer) > 0;
      }
    }
    out.push_back({name, item.value().numel(), param_part(name, adapter), frozen});
  }
  return out;
}

}  // namespace gmod

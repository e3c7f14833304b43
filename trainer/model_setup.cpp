#include "trainer/model_setup.h"

#include <torch/torch.h>

#include <stdexcept>

#include "model/config.h"
#include "mod/conversion.h"

namespace gmod {

MoDConfig convert_for_run(MultimodalLM& model, const ModSection& mod,
                          const std::function<std::vector<double>()>& arank_fn) {
  const int n_layers = model.config.text.num_hidden_layers;
  MoDConfig mc = mod.config;
  if (mc.mod_layers.empty()) {
    const ConversionRule rule = parse_conversion_rule(mod.rule);
    std::vector<double> arank;
    if (rule.kind == ConversionRule::Kind::kThreshold || rule.kind == ConversionRule::Kind::kKeepTop) {
      if (!arank_fn) throw std::invalid_argument("mod.rule " + mod.rule + " needs per-layer ARank, which is not available here");
      arank = arank_fn();
    }
    mc.mod_layers = select_mod_layers(rule, n_layers, arank);
    if (mc.selection.empty()) mc.selection = rule.to_string();
  }
  validate(mc, n_layers, "mod.config");
  convert_to_mod(model, mc);
  return mc;
}

std::shared_ptr<MultimodalLM> build_run_model(const TrainConfig& cfg, MoDConfig* mod_out) {
  auto model = std::make_shared<MultimodalLM>(load_model_config(cfg.model.path));
  MoDConfig mc;
  mc.mod_layers.clear();
  if (cfg.mod.enabled) mc = convert_for_run(*model, cfg.mod, nullptr);
  model->to(at::kCPU, cfg.model.dtype == "bf16" ? at::kBFloat16 : at::kFloat);
  if (mod_out) *mod_out = mc;
  return model;
}

}  // namespace gmod

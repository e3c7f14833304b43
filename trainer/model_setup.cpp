#include "trainer/model_setup.h"

#include <torch/torch.h>

#include <stdexcept>

#include "mod/conversion.h"
#include "mod/mod_checkpoint.h"
#include "model/compose.h"
#include "model/config.h"
#include "model/pretrained.h"

namespace gmod {

namespace {
ModelParts parts_of(const ModelSection& m) {
  ModelParts p;
  p.llm = m.llm;
  p.vision = m.vision;
  p.projector = m.projector;
  p.vision_feature_layer = m.vision_feature_layer;
  p.vision_feature_select_strategy = m.vision_feature_select_strategy;
  p.vision_slow = m.vision_slow;
  p.input_image_size = m.input_image_size;
  p.freeze_vision = m.freeze_vision;
  p.vision_aux = m.vision_aux;
  p.image_size_aux = m.image_size_aux;
  p.image_grid = m.image_grid;
  p.image_global = m.image_global;
  p.optimize_vision_tower = m.optimize_vision_tower;
  p.optimize_vision_tower_aux = m.optimize_vision_tower_aux;
  for (const auto& hw : m.image_grid_pinpoints)
    if (hw.size() == 2) p.image_grid_pinpoints.push_back({hw[0], hw[1]});
  return p;
}

// model.path's config.json "mod" object is gmod's own: read_mod_config refuses unknown keys in it. A γ-MoD
// dir would load here as its dense weights without its routers, which is not the model it describes: refused.
void refuse_mod_dir(const ModelSection& m) {
  if (!m.llm.empty()) return;
  if (const auto mc = read_mod_config(m.path); mc && !mc->mod_layers.empty())
    throw std::invalid_argument("model.path " + m.path + "/config.json is a γ-MoD model (\"mod\": " +
                                std::to_string(mc->mod_layers.size()) +
                                " MoD layers); gmod train starts from a dense model and converts it itself "
                                "(mod.*): give the dense model it was converted from");
}
}  // namespace

LlavaConfig run_model_config(const ModelSection& m) {
  refuse_mod_dir(m);
  return m.llm.empty() ? load_model_config(m.path) : compose_model_config(parts_of(m));
}

std::shared_ptr<MultimodalLM> load_run_model(const ModelSection& m, at::ScalarType dtype) {
  std::shared_ptr<MultimodalLM> model;
  if (m.init == "random") {
    model = std::make_shared<MultimodalLM>(run_model_config(m));
    model->init_weights(m.init_seed);
  } else if (m.llm.empty()) {
    refuse_mod_dir(m);
    return load_pretrained(m.path, dtype, at::kCPU);
  } else {
    model = load_composed(parts_of(m), dtype, at::kCPU, m.init_seed);  // parts copied straight into `dtype`
  }
  model->to(at::kCPU, dtype);
  return model;
}

std::string default_tokenizer_source(const ModelSection& m) { return m.llm.empty() ? m.path : m.llm; }
std::string preprocessor_source(const ModelSection& m) { return m.llm.empty() ? m.path : m.vision; }
std::string describe_model_source(const ModelSection& m) {
  if (m.llm.empty()) return m.path;
  return "llm=" + m.llm + (m.vision.empty() ? "" : " vision=" + m.vision) +
         (m.vision_slow.empty() ? "" : " vision_slow=" + m.vision_slow) +
         (m.vision_aux.empty() ? "" : " vision_aux=" + m.vision_aux) +
         (m.projector.empty() ? "" : " projector=" + m.projector) +
         (m.image_grid_pinpoints.empty()
              ? ""
              : " anyres=" + std::to_string(m.image_grid_pinpoints.size()) + " pinpoints");
}

MoDConfig convert_for_run(MultimodalLM& model, const ModSection& mod,
                          const std::function<std::vector<double>()>& arank_fn) {
  const int n_layers = model.config.text.num_hidden_layers;
  std::vector<double> arank;
  if (mod.config.mod_layers.empty() && rule_needs_arank(mod.rule)) {
    if (!arank_fn) throw std::invalid_argument("mod.rule " + mod.rule + " needs per-layer ARank, which is not available here");
    arank = arank_fn();
  }
  MoDConfig mc = config_for_rule(mod.rule, mod.config, n_layers, arank);
  validate(mc, n_layers, "mod.config");
  convert_to_mod(model, mc);
  return mc;
}

std::shared_ptr<MultimodalLM> build_run_model(const TrainConfig& cfg, MoDConfig* mod_out) {
  auto model = std::make_shared<MultimodalLM>(run_model_config(cfg.model));
  MoDConfig mc;
  mc.mod_layers.clear();
  if (cfg.mod.enabled) mc = convert_for_run(*model, cfg.mod, nullptr);
  model->to(at::kCPU, cfg.model.dtype == "bf16" ? at::kBFloat16 : at::kFloat);
  if (cfg.lora.enabled()) attach_run_lora(*model, cfg);
  if (mod_out) *mod_out = mc;
  return model;
}

LoraAttachment attach_run_lora(MultimodalLM& model, const TrainConfig& cfg) {
  return attach_lora(model, cfg.lora, cfg.model.init_seed);
}

}  // namespace gmod

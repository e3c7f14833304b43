#include "mod/mod_checkpoint.h"

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "model/config.h"
#include "model/hf_names.h"
#include "model/json_file.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "mod/conversion.h"
#include "mod/pmod.h"
#include "mod/pmod_checkpoint.h"

namespace gmod {
namespace {

std::string layers_string(const std::vector<int>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  return os.str();
}

// "<prefix>layers." as the checkpoint names its decoder layers (e.g. "model.layers." or
// "language_model.model.layers."), "" when it names none.
std::string layers_prefix_in(const CheckpointFiles& ckpt) {
  for (const auto& hf : ckpt.names()) {
    const auto g = hf_to_gmod(hf);
    const auto k = hf.find("layers.");
    if (g && g->rfind("llm.layers.", 0) == 0 && k != std::string::npos) return hf.substr(0, k + 7);
  }
  return "";
}

}  // namespace

void check_finite_weights(const MultimodalLM& m, const std::string& what, const std::string& verb) {
  std::vector<std::string> bad;
  size_t n_bad = 0;
  for (const auto& p : m.named_parameters(true)) {
    const at::Tensor& t = p.value();
    if (!t.is_floating_point() || at::isfinite(t).all().item<bool>()) continue;
    if (++n_bad <= 5)
      bad.push_back(p.key() + " (" + std::to_string(at::isnan(t).sum().item<int64_t>()) + " NaN, " +
                    std::to_string(at::isinf(t).sum().item<int64_t>()) + " inf of " +
                    std::to_string(t.numel()) + ")");
  }
  if (n_bad == 0) return;
  std::string msg =
      what + ": the weights are non-finite in " + std::to_string(n_bad) + " tensor(s), nothing " + verb + ":";
  for (const auto& b : bad) msg += "\n  " + b;
  if (n_bad > bad.size()) msg += "\n  ... and " + std::to_string(n_bad - bad.size()) + " more";
  throw std::runtime_error(msg);
}

void save_mod_pretrained(const MultimodalLM& model, const MoDConfig& cfg, const std::string& dir) {
  check_finite_weights(model, dir);
  const auto layers = mod_layers(model);
  if (layers.size() != cfg.mod_layers.size())
    throw std::invalid_argument("save_mod_pretrained(" + dir + "): the model has " + std::to_string(layers.size()) +
                                " MoD layers but the MoD config lists [" + layers_string(cfg.mod_layers) +
                                "] (convert the model with this config first)");
  if (cfg.mod_layers.empty()) {
    save_pretrained(model, dir);
    return;
  }
  const auto layout = model.config.qwen3_vision       ? HfLayout::kQwen3VL
                      : model.config.qwen_vision       ? HfLayout::kQwen25VL
                      : model.config.original_layout() ? HfLayout::kLlavaHr
                      : model.vision                   ? HfLayout::kLlava
                                                       : HfLayout::kLlama;
  std::vector<std::pair<std::string, at::Tensor>> extra;
  std::vector<std::string> skip;
  if (cfg.router == RouterKind::kGammaShared) {
    auto router = shared_router(model);
    if (!router) throw std::invalid_argument("save_mod_pretrained(" + dir + "): γ-MoD config but the model has no shared router");
    for (const auto& p : router->named_parameters(true)) {
      if (p.key() != "weight")
        throw std::runtime_error("save_mod_pretrained: unexpected shared-router parameter '" + p.key() + "'");
      skip.push_back("mod_router." + p.key());
      for (int i : cfg.mod_layers) extra.emplace_back(hf_router_name(i, layout), p.value().detach());
    }
  }
  // Per-layer routers are parameters llm.layers.{i}.router.weight: save_pretrained names them itself.
  nlohmann::json extra_cfg = {{"mod", to_json(cfg)}};
  save_pretrained(model, dir, extra, extra_cfg.dump(), 2ull << 30, skip);
}

std::optional<MoDConfig> read_mod_config(const std::string& dir) {
  const auto path = (std::filesystem::path(dir) / "config.json").string();
  const nlohmann::json j = load_json_file(path);
  if (j.contains("mod") && j["mod"].is_object()) {
    // Validated before mod_enable is looked at: a disabled object with a misspelt key is still a mistake.
    MoDConfig c = mod_config_from_json(j["mod"], path + ": \"mod\"");
    const auto& en = j["mod"].contains("mod_enable") ? j["mod"]["mod_enable"] : nlohmann::json(true);
    if (!en.is_boolean())
      throw std::invalid_argument(path + ": \"mod\": mod_enable must be true or false, not " + en.dump());
    if (!en.get<bool>()) return std::nullopt;
    return c;
  }
  if (j.value("model_type", std::string()) == "pmod_llava_llama")  // the original p-MoD code's config
    return pmod_config_from_official(j, load_model_config(dir).text.num_hidden_layers, PModDenominator::kOfficial31,
                                     path);
  if (j.value("mod_enable", false) && j.contains("mod_layers_idx") && j["mod_layers_idx"].is_array()) {
    MoDConfig c;  // official γ-MoD config: defaults of the official code
    c.mod_layers = j["mod_layers_idx"].get<std::vector<int>>();
    c.selection = "mod_layers_idx";
    return c;
  }
  return std::nullopt;
}

std::shared_ptr<MultimodalLM> load_mod_pretrained(const std::string& dir, at::ScalarType dtype, at::Device device) {
  if (is_pmod_original(dir)) return load_pmod_original(dir, PModDenominator::kOfficial31, dtype, device);
  const auto mc = read_mod_config(dir);
  if (!mc || mc->mod_layers.empty()) return load_pretrained(dir, dtype, device);
  auto model = std::make_shared<MultimodalLM>(load_model_config(dir));
  convert_to_mod(*model, *mc);
  model->to(device, dtype);

  const bool gamma = mc->router == RouterKind::kGammaShared;
  LoadOptions opt;
  if (gamma) {
    opt.skip = [](const std::string& hf) { return hf_router_layer(hf).has_value(); };
    opt.optional_prefixes = {"mod_router."};
  }
  const CheckpointFiles ckpt(dir);  // opened once: a .bin checkpoint is read into memory when opened
  load_weights(*model, ckpt, opt);
  if (!gamma) return model;

  // γ-MoD: the one shared router. The original holds it once and every MoD layer references it; a .bin save
  // (torch.save keeps aliases) writes one copy per MoD layer, a safetensors save by transformers keeps only the
  // first MoD layer's name (it drops aliases), and gmod writes every copy. Any non-empty subset of the copies is
  // accepted; the copies present must be equal.
  std::map<int, std::string> copies;
  for (const auto& hf : ckpt.names())
    if (auto l = hf_router_layer(hf)) {
      if (!mc->is_mod_layer(*l))
        throw std::runtime_error(ckpt.file_of(hf) + ": router tensor '" + hf + "' for layer " + std::to_string(*l) +
                                 ", which the config's mod_layers_idx [" + layers_string(mc->mod_layers) +
                                 "] does not list");
      if (!copies.emplace(*l, hf).second)
        throw std::runtime_error(ckpt.file_of(hf) + ": two router tensors for layer " + std::to_string(*l) + ": '" +
                                 copies[*l] + "' and '" + hf + "'");
    }
  if (copies.empty()) {
    const std::string prefix = layers_prefix_in(ckpt);
    std::string m;
    for (int l : mc->mod_layers)
      m += (m.empty() ? "" : ", ") +
           (prefix.empty() ? hf_router_name(l, model->config.qwen3_vision  ? HfLayout::kQwen3VL
                                                   : model->config.qwen_vision ? HfLayout::kQwen25VL
                                                   : model->config.original_layout() ? HfLayout::kLlavaHr
                                                   : model->vision                  ? HfLayout::kLlava
                                                                                    : HfLayout::kLlama)
                           : prefix + std::to_string(l) + ".router.weight");
    throw std::runtime_error(dir + ": γ-MoD checkpoint holds no copy of the shared router (one of " + m +
                             ", for the MoD layers [" + layers_string(mc->mod_layers) + "])");
  }
  const std::string& first = copies.begin()->second;
  const at::Tensor ref = ckpt.tensor(first);
  for (const auto& [l, hf] : copies) {
    const at::Tensor t = ckpt.tensor(hf);
    if (!t.sizes().equals(ref.sizes()) || t.scalar_type() != ref.scalar_type() || !at::equal(t, ref))
      throw std::runtime_error(ckpt.file_of(hf) + ": γ-MoD router copies differ: '" + hf + "' is not equal to '" +
                               first + "' (in " + ckpt.file_of(first) +
                               "); the MoD layers share one router, so every copy a checkpoint holds must be the "
                               "same tensor");
  }
  auto router = shared_router(*model);
  at::NoGradGuard ng;
  for (auto& p : router->named_parameters(true)) {
    if (p.key() != "weight") continue;
    at::Tensor dst = p.value();
    copy_into(dst, ref, first, ckpt.file_of(first));
  }
  return model;
}

}  // namespace gmod

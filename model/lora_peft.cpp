#include "model/lora_peft.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "model/hf_names.h"
#include "model/llava.h"
#include "model/safetensors.h"

namespace gmod {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::string kPrefix = "base_model.model.";

// Leaf names of the adapted modules (what find_all_linear_names gives PEFT for "all-linear").
std::vector<std::string> leaf_targets(const MultimodalLM& model) {
  std::set<std::string> leaves;
  for (const auto& [name, lin] : lora_modules(model)) leaves.insert(name.substr(name.rfind('.') + 1));
  return {leaves.begin(), leaves.end()};
}

}  // namespace

std::string peft_module_name(const MultimodalLM& model, const std::string& gmod_module) {
  return kPrefix + hf_module_name(model, gmod_module);
}

void save_peft_adapter(const MultimodalLM& model, const LoraConfig& c, const std::string& dir,
                       const std::string& base_model) {
  const auto mods = lora_modules(model);
  if (mods.empty()) throw std::invalid_argument("save_peft_adapter: the model has no LoRA adapters");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, lin] : mods) {
    const auto a = lora_adapter_of(*lin);
    const std::string key = peft_module_name(model, name);
    tensors.emplace_back(key + ".lora_A.weight", a->lora_A->weight.detach());
    tensors.emplace_back(key + ".lora_B.weight", a->lora_B->weight.detach());
  }
  fs::create_directories(dir);
  save_safetensors((fs::path(dir) / "adapter_model.safetensors").string(), tensors, {{"format", "pt"}});
  // PEFT matches target_modules as name suffixes over the whole model. With a vision tower (whose attention
  // has q_proj/k_proj/v_proj too) the adapted modules are listed one by one from "language_model." on, which
  // matches nothing in the tower; a LLaMA keeps the configured names (all-linear: the adapted leaf names).
  std::vector<std::string> targets = c.targets;
  if (model.vision) {
    targets.clear();
    for (const auto& [name, lin] : mods) {
      const std::string hf = hf_module_name(model, name);
      // "language_model.layers.0.self_attn.q_proj"; the original LLaVA layout (LLaVA-HR, MGM) the whole name
      targets.push_back(model.config.original_layout() ? hf : hf.substr(hf.find('.') + 1));
    }
  } else {
    for (const auto& t : c.targets)
      if (t == "all-linear") targets = leaf_targets(model);
  }
  const json cfg = {{"peft_type", "LORA"},
                    {"task_type", "CAUSAL_LM"},
                    {"base_model_name_or_path", base_model},
                    {"r", c.r},
                    {"lora_alpha", c.alpha},
                    {"lora_dropout", c.dropout},
                    {"target_modules", targets},
                    {"bias", c.bias},
                    {"fan_in_fan_out", false},
                    {"inference_mode", true},
                    {"init_lora_weights", true},
                    {"use_rslora", false},
                    {"use_dora", false},
                    {"modules_to_save", nullptr},
                    {"rank_pattern", json::object()},
                    {"alpha_pattern", json::object()}};
  const fs::path path = fs::path(dir) / "adapter_config.json";
  std::ofstream out(path);
  out << cfg.dump(2) << "\n";
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

LoraConfig read_peft_adapter_config(const std::string& dir) {
  const fs::path path = fs::path(dir) / "adapter_config.json";
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path.string() + ": cannot open (not a PEFT adapter directory)");
  json j;
  try {
    j = json::parse(in);
  } catch (const std::exception& e) {
    throw std::runtime_error(path.string() + ": not valid JSON: " + e.what());
  }
  const std::string where = path.string() + ": ";
  auto need = [&](const char* key) -> const json& {
    if (!j.contains(key)) throw std::runtime_error(where + "no \"" + key + "\"");
    return j.at(key);
  };
  auto refuse_true = [&](const char* key) {
    if (j.contains(key) && j.at(key).is_boolean() && j.at(key).get<bool>())
      throw std::runtime_error(where + "\"" + key + "\": true is not built in gmod");
  };
  auto refuse_nonempty = [&](const char* key) {
    if (j.contains(key) && j.at(key).is_object() && !j.at(key).empty())
      throw std::runtime_error(where + "\"" + key + "\": per-module ranks/alphas are not built in gmod");
  };
  try {
    if (need("peft_type").get<std::string>() != "LORA")
      throw std::runtime_error(where + "peft_type " + j.at("peft_type").dump() + ", expected \"LORA\"");
    refuse_true("use_dora"), refuse_true("use_rslora"), refuse_true("fan_in_fan_out");
    refuse_nonempty("rank_pattern"), refuse_nonempty("alpha_pattern");
    LoraConfig c;
    c.r = need("r").get<int>();
    c.alpha = need("lora_alpha").get<double>();
    c.dropout = j.value("lora_dropout", 0.0);
    c.bias = j.value("bias", std::string("none"));
    const json& t = need("target_modules");
    if (!t.is_array())
      throw std::runtime_error(where + "target_modules " + t.dump() +
                               ": only a list of module names is read (a regex string is not)");
    c.targets = t.get<std::vector<std::string>>();
    if (c.r < 1) throw std::runtime_error(where + "r " + std::to_string(c.r) + ", expected >= 1");
    for (const auto& e : check_lora_config(c)) throw std::runtime_error(where + e);
    return c;
  } catch (const json::exception& e) {
    throw std::runtime_error(where + "wrong type: " + e.what());
  }
}

LoraAttachment load_peft_adapter(MultimodalLM& model, const std::string& dir) {
  const LoraConfig c = read_peft_adapter_config(dir);
  LoraAttachment att = attach_lora(model, c, 0);
  // PEFT writes adapter_model.safetensors; with safe_serialization=False (the default of PEFT releases before
  // safetensors became theirs, e.g. LLaVA's LoRA runs) adapter_model.bin, a torch.save state dict.
  const std::string st_file = (fs::path(dir) / "adapter_model.safetensors").string();
  const std::string bin_file = (fs::path(dir) / "adapter_model.bin").string();
  const std::string file = fs::exists(st_file) || !fs::exists(bin_file) ? st_file : bin_file;
  if (!fs::exists(file)) throw std::runtime_error(file + ": missing (the adapter weights; no adapter_model.bin either)");
  const CheckpointFiles st(file);
  std::map<std::string, at::Tensor*> want;  // PEFT key -> adapter parameter
  for (const auto& [name, lin] : lora_modules(model)) {
    const auto a = lora_adapter_of(*lin);
    const std::string key = peft_module_name(model, name);
    want[key + ".lora_A.weight"] = &a->lora_A->weight;
    want[key + ".lora_B.weight"] = &a->lora_B->weight;
  }
  std::set<std::string> seen;
  for (const auto& key : st.names()) {
    auto it = want.find(key);
    if (it == want.end())
      throw std::runtime_error(file + ": tensor " + key +
                               " belongs to no adapter of this model (target_modules " +
                               "and the base model must match what the adapter was trained on)");
    copy_into(*it->second, st.tensor(key), key, file);
    seen.insert(key);
  }
  for (const auto& [key, p] : want)
    if (!seen.count(key)) throw std::runtime_error(file + ": no tensor " + key + " (adapter weight missing)");
  return att;
}

}  // namespace gmod

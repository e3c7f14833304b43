#include "mod/pmod_checkpoint.h"

#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "model/config.h"
#include "model/hf_names.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "mod/conversion.h"
#include "mod/pmod.h"

namespace gmod {
namespace {

constexpr const char* kWrapped = ".decoder_layer.";
constexpr const char* kRouter = ".router.router.";

nlohmann::json read_config(const std::string& dir) {
  const auto path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream f(path);
  if (!f) throw std::runtime_error(path + ": cannot open");
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": not valid JSON: " + e.what());
  }
}

bool wrapped(const std::string& hf) {
  return hf.find(kWrapped) != std::string::npos || hf.find(kRouter) != std::string::npos;
}

}  // namespace

std::string pmod_unwrap_name(const std::string& hf) {
  std::string s = hf;
  if (auto p = s.find(kWrapped); p != std::string::npos) s.replace(p, std::string(kWrapped).size(), ".");
  if (auto p = s.find(kRouter); p != std::string::npos) s.replace(p, std::string(kRouter).size(), ".router.");
  return s;
}

bool is_pmod_original(const std::string& dir) {
  const auto j = read_config(dir);
  return j.value("model_type", std::string()) == "pmod_llava_llama";
}

std::shared_ptr<MultimodalLM> load_pmod_original(const std::string& dir, PModDenominator denominator,
                                                 at::ScalarType dtype, at::Device device) {
  const auto j = read_config(dir);
  const auto cfg = load_model_config(dir);
  const int n = cfg.text.num_hidden_layers;
  const MoDConfig mc = pmod_config_from_official(j, n, denominator, dir + "/config.json");
  auto model = std::make_shared<MultimodalLM>(cfg);
  convert_to_mod(*model, mc);
  model->to(device, dtype);

  LoadOptions opt;
  opt.skip = wrapped;
  for (int l : mc.mod_layers) opt.optional_prefixes.push_back("llm.layers." + std::to_string(l) + ".");
  load_weights(*model, dir, opt);

  // The MoD layers' tensors: under the wrapper names.
  SafetensorsCheckpoint ckpt(dir);
  auto params = model->named_parameters(true);
  std::set<std::string> filled;
  at::NoGradGuard ng;
  for (const auto& hf : ckpt.names()) {
    if (!wrapped(hf)) continue;
    const auto g = hf_to_gmod(pmod_unwrap_name(hf));
    if (!g || !params.contains(*g))
      throw std::runtime_error(ckpt.file_of(hf) + ": p-MoD tensor '" + hf + "' has no gmod parameter (" +
                               (g ? *g : std::string("unmapped")) + "); is its layer one the schedule routes?");
    at::Tensor dst = params[*g];
    copy_into(dst, ckpt.tensor(hf), hf, ckpt.file_of(hf));
    filled.insert(*g);
  }
  std::string missing;
  for (int l : mc.mod_layers) {
    const std::string pre = "llm.layers." + std::to_string(l) + ".";
    for (const auto& p : params)
      if (p.key().rfind(pre, 0) == 0 && !filled.count(p.key())) missing += (missing.empty() ? "" : ", ") + p.key();
  }
  if (!missing.empty())
    throw std::runtime_error(dir + ": p-MoD checkpoint lacks the MoD-layer tensors of " + missing +
                             " (expected under model.layers.{i}.decoder_layer.* and model.layers.{i}.router.router.*)");
  return model;
}

}  // namespace gmod

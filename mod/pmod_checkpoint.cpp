#include "mod/pmod_checkpoint.h"

#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "model/config.h"
#include "model/hf_names.h"
#include "model/json_file.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "mod/mod_checkpoint.h"
#include "mod/conversion.h"
#include "mod/pmod.h"

namespace gmod {
namespace {

constexpr const char* kWrapped = ".decoder_layer.";
constexpr const char* kRouter = ".router.router.";

nlohmann::json read_config(const std::string& dir) {
  return load_json_file((std::filesystem::path(dir) / "config.json").string());
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
  const CheckpointFiles ckpt(dir);  // opened once: a .bin checkpoint is read into memory when opened
  load_weights(*model, ckpt, opt);

  // The MoD layers' tensors: under the wrapper names.
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


namespace {

// The original's config strings: "shiftedcos_decay_0.85_0.15" (its regex wants a decimal point), "tanh_0.2_1".
std::string decimal(double v, bool point) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.10g", v);
  std::string s = buf;
  if (point && s.find('.') == std::string::npos && s.find('e') == std::string::npos) s += ".0";
  return s;
}

void write_json(const std::filesystem::path& p, const nlohmann::json& j) { save_json_file(p.string(), j); }

}  // namespace

void save_pmod_original(const MultimodalLM& model, const MoDConfig& mc, const std::string& dir) {
  namespace fs = std::filesystem;
  const auto& c = model.config;
  const int n = c.text.num_hidden_layers;
  if (mc.router != RouterKind::kPMoD)
    throw std::invalid_argument("save_pmod_original(" + dir + "): the model's router is " + to_string(mc.router) +
                                ", not pmod");
  if (!c.vision || c.original_layout())
    throw std::invalid_argument("save_pmod_original(" + dir + "): the original p-MoD code is LLaVA with one CLIP tower");
  if (mc.pmod_denominator != PModDenominator::kOfficial31 && n - 1 != 31)
    throw std::invalid_argument(
        "save_pmod_original(" + dir + "): this model's schedule divides by num_layers - 1 = " + std::to_string(n - 1) +
        " (pmod_denominator \"depth\") but the original code hard-codes 31: it would keep other image tokens in "
        "other layers. Train with pmod_denominator \"official_31\" for the original code, or export gmod's layout");
  if (mc.pmod_weight_norm != PModWeightNorm::kTanh)
    throw std::invalid_argument("save_pmod_original(" + dir + "): the original code's weight norm is TanhNorm");
  check_finite_weights(model, dir);
  fs::create_directories(fs::path(dir) / "clip");

  std::vector<std::pair<std::string, at::Tensor>> tensors;
  auto wrap = [&](std::string hf) {  // model.layers.{i}.X -> model.layers.{i}.decoder_layer.X / router.router.X
    for (int l : mc.mod_layers) {
      const std::string pre = "model.layers." + std::to_string(l) + ".";
      if (hf.rfind(pre, 0) != 0) continue;
      const std::string rest = hf.substr(pre.size());
      return pre + (rest.rfind("router.", 0) == 0 ? "router." + rest : "decoder_layer." + rest);
    }
    return hf;
  };
  for (const auto& p : model.named_parameters(true))
    tensors.emplace_back(wrap(gmod_to_hf(p.key(), HfLayout::kLlavaHr)), p.value().detach());
  save_safetensors((fs::path(dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});

  nlohmann::json j = llama_config_to_json(c.text);
  if (!j.contains("rope_scaling")) j["rope_scaling"] = nullptr;  // as transformers 4.37 (the original's) writes it
  const auto dtype = model.llm->embed_tokens.scalar_type();
  j["architectures"] = {"PmodLlavaLlamaForCausalLM"};
  j["model_type"] = "pmod_llava_llama";
  j["torch_dtype"] = dtype == at::kBFloat16 ? "bfloat16" : dtype == at::kHalf ? "float16" : "float32";
  j["mm_vision_tower"] = "clip";
  j["mm_hidden_size"] = c.vision->hidden_size;
  j["mm_projector_type"] = c.projector_type;
  j["mm_vision_select_layer"] = c.vision_feature_layer;
  j["mm_vision_select_feature"] = c.vision_feature_select_strategy == "full" ? "cls_patch" : "patch";
  j["mm_patch_merge_type"] = "flat";
  j["mm_use_im_start_end"] = false;
  j["mm_use_im_patch_token"] = false;
  j["image_aspect_ratio"] = "pad";
  j["use_mm_proj"] = true;
  j["tokenizer_model_max_length"] = c.text.max_position_embeddings;
  j["tokenizer_padding_side"] = "right";
  j["mod_target_layers"] = to_string(mc.pmod_schedule) + "_decay_" + decimal(mc.pmod_max_ratio, true) + "_" +
                           decimal(mc.pmod_min_ratio, true);
  j["mod_router_factor"] = mc.pmod_factor;
  j["mod_weight_norm"] = "tanh_" + decimal(mc.pmod_tanh_scale, false) + "_" + decimal(mc.pmod_tanh_bias, false);
  j["mod_bias_enabled"] = mc.pmod_router_bias;
  j["mod_special_init"] = mc.router_init == "zero";
  j["mod_target_token_type"] = "vision_all";
  j["mod_target_layer_indices"] = mc.mod_layers;
  write_json(fs::path(dir) / "config.json", j);

  nlohmann::json clip = clip_config_to_json(*c.vision);
  clip["architectures"] = {"CLIPVisionModel"};
  write_json(fs::path(dir) / "clip" / "config.json", clip);
  const int s = c.vision->image_size;
  write_json(fs::path(dir) / "clip" / "preprocessor_config.json",
             {{"image_processor_type", "CLIPImageProcessor"}, {"crop_size", {{"height", s}, {"width", s}}},
              {"size", {{"shortest_edge", s}}}, {"do_center_crop", true}, {"do_normalize", true},
              {"do_resize", true}, {"do_rescale", true}, {"do_convert_rgb", true}, {"resample", 3},
              {"rescale_factor", 1.0 / 255.0}, {"image_mean", {0.48145466, 0.4578275, 0.40821073}},
              {"image_std", {0.26862954, 0.26130258, 0.27577711}}});
}

}  // namespace gmod

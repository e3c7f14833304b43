#include "model/pretrained.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "model/llava_hr_config.h"
#include "model/llava_next_config.h"
#include "model/mgm_config.h"
#include "model/safetensors.h"

namespace gmod {
namespace {

bool has_prefix(const std::string& s, const std::vector<std::string>& prefixes) {
  for (auto& p : prefixes)
    if (s.compare(0, p.size(), p) == 0) return true;
  return false;
}

std::string join_some(const std::vector<std::string>& v, size_t n = 8) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size() && i < n; ++i) os << (i ? ", " : "") << v[i];
  if (v.size() > n) os << ", ... (" << v.size() << " in all)";
  return os.str();
}

}  // namespace

LoadReport load_weights(MultimodalLM& model, const std::string& path, const LoadOptions& opt) {
  return load_weights(model, CheckpointFiles(path), opt);
}

LoadReport load_weights(MultimodalLM& model, const CheckpointFiles& ckpt, const LoadOptions& opt) {
  const std::string& path = ckpt.path();
  LoadReport report;
  auto params = model.named_parameters(/*recurse=*/true);
  std::set<std::string> seen;
  std::vector<std::string> unknown, problems;  // every problem is reported, in one error
  at::NoGradGuard ng;
  for (const auto& hf : ckpt.names()) {
    if (opt.skip && opt.skip(hf)) {
      report.unmapped.push_back(hf);
      continue;
    }
    auto name = hf_to_gmod(hf);
    if (name && *name == "lm_head.weight" && model.config.text.tie_word_embeddings) name.reset();  // tied copy
    if (!name || !params.contains(*name)) {
      if (has_prefix(hf, opt.ignore_unknown_prefixes) || hf_unused(hf) ||
          (hf == "lm_head.weight" || hf == "language_model.lm_head.weight")) {
        report.unmapped.push_back(hf);
        continue;
      }
      unknown.push_back(hf);
      continue;
    }
    if (!seen.insert(*name).second)
      throw std::runtime_error(ckpt.file_of(hf) + ": tensor '" + hf + "' maps to '" + *name +
                               "', which another checkpoint tensor already provided");
    auto& dst = params[*name];
    try {
      copy_into(dst, ckpt.tensor(hf), hf, ckpt.file_of(hf));
      report.loaded.push_back(*name);
    } catch (const std::exception& e) {  // shape or dtype mismatch: keep going, report them all
      problems.push_back(e.what());
    }
  }
  if (!unknown.empty())
    problems.push_back(path + ": checkpoint tensors that this model does not have: " + join_some(unknown) +
                       " (wrong model config, or pass ignore_unknown_prefixes)");
  std::vector<std::string> missing;
  for (const auto& p : params) {
    if (seen.count(p.key())) continue;
    if (opt.partial || has_prefix(p.key(), opt.optional_prefixes)) report.missing.push_back(p.key());
    else missing.push_back(p.key());
  }
  if (!missing.empty()) problems.push_back(path + ": checkpoint lacks tensors the model needs: " + join_some(missing));
  if (!problems.empty()) {
    std::string msg;
    for (const auto& p : problems) msg += (msg.empty() ? "" : "\n") + p;
    throw std::runtime_error(msg);
  }
  if (report.loaded.empty()) throw std::runtime_error(path + ": no tensor of the checkpoint matches the model");
  return report;
}

std::shared_ptr<MultimodalLM> load_pretrained(const std::string& dir, at::ScalarType dtype, at::Device device,
                                              const LoadOptions& opt) {
  auto cfg = load_model_config(dir);
  auto model = std::make_shared<MultimodalLM>(cfg);
  model->to(device, dtype);
  load_weights(*model, dir, opt);
  return model;
}

namespace {

// Qwen2_5_VLForConditionalGeneration's config.json in transformers 5's layout (what its save_pretrained writes):
// the text model under text_config (model_type qwen2_5_vl_text, M-RoPE in rope_parameters), the encoder's
// vision_config, the image and video token ids. vision_start/end_token_id are not held by gmod (the 3-D positions
// come from the image tokens' runs): transformers' defaults stand, the published models' ids.
nlohmann::json qwen2_5_vl_config_json(const LlavaConfig& c, nlohmann::json text) {
  const Qwen25VisionConfig& v = *c.qwen_vision;
  const MRopeConfig& r = *c.mrope;
  text["model_type"] = "qwen2_5_vl_text";
  text.erase("rope_theta");
  text.erase("rope_scaling");
  text["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", r.rope_theta}, {"mrope_section", r.mrope_section}};
  text["image_token_id"] = r.image_token_id;
  text["video_token_id"] = r.video_token_id;
  const nlohmann::json vision = {{"model_type", "qwen2_5_vl_vision"},
                                 {"depth", v.depth},
                                 {"hidden_size", v.hidden_size},
                                 {"intermediate_size", v.intermediate_size},
                                 {"num_heads", v.num_heads},
                                 {"in_channels", v.in_channels},
                                 {"out_hidden_size", v.out_hidden_size},
                                 {"patch_size", v.patch_size},
                                 {"temporal_patch_size", v.temporal_patch_size},
                                 {"spatial_merge_size", v.spatial_merge_size},
                                 {"window_size", v.window_size},
                                 {"fullatt_block_indexes", v.fullatt_block_indexes},
                                 {"tokens_per_second", v.tokens_per_second},
                                 {"hidden_act", v.hidden_act},
                                 {"initializer_range", v.initializer_range},
                                 {"rope_parameters", {{"rope_type", "axial"}, {"rope_theta", v.rope_theta}}}};
  return {{"architectures", {"Qwen2_5_VLForConditionalGeneration"}},
          {"model_type", "qwen2_5_vl"},
          {"text_config", text},
          {"vision_config", vision},
          {"image_token_id", r.image_token_id},
          {"video_token_id", r.video_token_id},
          {"tie_word_embeddings", c.text.tie_word_embeddings}};
}

// Qwen3VLForConditionalGeneration's config.json as transformers 5's save_pretrained writes it: the Qwen3 text model
// under text_config (model_type qwen3_vl_text, interleaved M-RoPE in rope_parameters, head_dim), the encoder's
// vision_config with deepstack_visual_indexes, the image and video token ids. vision_start/end_token_id are not held
// by gmod: transformers' defaults stand.
nlohmann::json qwen3_vl_config_json(const LlavaConfig& c, nlohmann::json text) {
  const Qwen3VisionConfig& v = *c.qwen3_vision;
  const MRopeConfig& r = *c.mrope;
  text["model_type"] = "qwen3_vl_text";
  text.erase("rope_theta");
  text.erase("rope_scaling");
  text.erase("use_sliding_window");
  text["rope_parameters"] = {{"rope_type", "default"},
                             {"rope_theta", r.rope_theta},
                             {"mrope_section", r.mrope_section},
                             {"mrope_interleaved", true}};
  const nlohmann::json vision = {{"model_type", "qwen3_vl_vision"},
                                 {"depth", v.depth},
                                 {"hidden_size", v.hidden_size},
                                 {"intermediate_size", v.intermediate_size},
                                 {"num_heads", v.num_heads},
                                 {"in_channels", v.in_channels},
                                 {"out_hidden_size", v.out_hidden_size},
                                 {"patch_size", v.patch_size},
                                 {"temporal_patch_size", v.temporal_patch_size},
                                 {"spatial_merge_size", v.spatial_merge_size},
                                 {"num_position_embeddings", v.num_position_embeddings},
                                 {"deepstack_visual_indexes", v.deepstack_visual_indexes},
                                 {"hidden_act", v.hidden_act},
                                 {"initializer_range", v.initializer_range},
                                 {"rope_parameters", {{"rope_type", "axial"}, {"rope_theta", v.rope_theta}}}};
  return {{"architectures", {"Qwen3VLForConditionalGeneration"}},
          {"model_type", "qwen3_vl"},
          {"text_config", text},
          {"vision_config", vision},
          {"image_token_id", r.image_token_id},
          {"video_token_id", r.video_token_id},
          {"tie_word_embeddings", c.text.tie_word_embeddings}};
}

}  // namespace

void save_pretrained(const MultimodalLM& model, const std::string& dir,
                     const std::vector<std::pair<std::string, at::Tensor>>& extra_tensors,
                     const std::string& extra_config_json, uint64_t max_shard_bytes,
                     const std::vector<std::string>& skip_params) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  const bool llava = model.vision != nullptr;
  const bool hr = model.config.original_layout();  // LLaVA-HR, MGM: the original code's layout
  const bool qwen = model.config.qwen_vision.has_value(), qwen3 = model.config.qwen3_vision.has_value();
  const auto layout = qwen3  ? HfLayout::kQwen3VL
                      : qwen ? HfLayout::kQwen25VL
                      : hr   ? HfLayout::kLlavaHr
                      : llava ? HfLayout::kLlava
                              : HfLayout::kLlama;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  int64_t bytes = 0;
  for (const auto& p : model.named_parameters(true)) {
    if (std::find(skip_params.begin(), skip_params.end(), p.key()) != skip_params.end()) continue;
    tensors.emplace_back(gmod_to_hf(p.key(), layout), p.value().detach());
    bytes += p.value().numel() * p.value().element_size();
  }
  for (auto& t : extra_tensors) tensors.push_back(t);
  const auto& c = model.config;
  nlohmann::json text = llama_config_to_json(c.text);
  nlohmann::json cfg;
  auto dtype = model.llm->embed_tokens.scalar_type();
  std::string dtype_name = dtype == at::kBFloat16 ? "bfloat16" : dtype == at::kHalf ? "float16" : "float32";
  if (qwen3) {
    cfg = qwen3_vl_config_json(c, text);
    cfg["torch_dtype"] = dtype_name;
  } else if (qwen) {
    cfg = qwen2_5_vl_config_json(c, text);
    cfg["torch_dtype"] = dtype_name;
  } else if (hr) {
    cfg = text;
    cfg["architectures"] = {c.mgm ? "MGMLlamaForCausalLM" : "LlavaLlamaForCausalLM"};
    cfg["model_type"] = c.mgm ? "mgm" : "llava";
    cfg["vision_config"] = clip_config_to_json(*c.vision);
    cfg["mm_hidden_size"] = c.vision->hidden_size;
    cfg["mm_projector_type"] = c.projector_type;
    cfg["mm_vision_select_layer"] = c.vision_feature_layer;
    cfg["mm_vision_select_feature"] = c.vision_feature_select_strategy == "full" ? "cls_patch" : "patch";
    cfg["image_token_id"] = c.image_token_id;
    cfg["torch_dtype"] = dtype_name;
    llava_hr_fields_to_json(c, cfg);
    mgm_fields_to_json(c, cfg);
    llava_next_fields_to_json(c, /*original=*/true, cfg);
  } else if (llava) {
    cfg = {{"architectures", {"LlavaForConditionalGeneration"}},
           {"model_type", "llava"},
           {"text_config", text},
           {"vision_config", clip_config_to_json(*c.vision)},
           {"image_token_index", c.image_token_id},
           {"projector_hidden_act", c.projector_hidden_act},
           {"vision_feature_layer", c.vision_feature_layer},
           {"vision_feature_select_strategy", c.vision_feature_select_strategy},
           {"image_seq_length", c.image_seq_length()},
           {"multimodal_projector_bias", true},
           {"tie_word_embeddings", c.text.tie_word_embeddings},
           {"torch_dtype", dtype_name}};
    llava_next_fields_to_json(c, /*original=*/false, cfg);
  } else {
    cfg = text;
    cfg["architectures"] = {llm_architecture(c.text.family)};
    cfg["torch_dtype"] = dtype_name;
  }
  auto extra = nlohmann::json::parse(extra_config_json);
  for (auto& [k, v] : extra.items()) cfg[k] = v;
  {
    std::ofstream f(fs::path(dir) / "config.json.tmp");
    f << cfg.dump(2) << "\n";
    if (!f) throw std::runtime_error(dir + ": cannot write config.json");
  }
  fs::rename(fs::path(dir) / "config.json.tmp", fs::path(dir) / "config.json");
  std::map<std::string, std::string> meta = {{"format", "pt"}};
  if (static_cast<uint64_t>(bytes) <= max_shard_bytes)
    save_safetensors((fs::path(dir) / "model.safetensors").string(), tensors, meta);
  else
    save_safetensors_sharded(dir, tensors, max_shard_bytes, meta);
}

}  // namespace gmod

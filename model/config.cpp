#include "model/config.h"
#include "model/qwen_vl_config_parse.h"
#include "model/model_types.h"

#include "model/llava_hr_config.h"
#include "model/llava_next_config.h"
#include "model/mgm_config.h"
#include "model/tower_refs.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <type_traits>

namespace gmod {
namespace {

// Collects every problem of one config before throwing, so a user fixes them all in one go.
struct Reader {
  const nlohmann::json& j;
  std::string where;
  std::vector<std::string>& errors;

  template <typename T>
  void required(const char* key, T& out) {
    if (!j.contains(key) || j[key].is_null()) {
      errors.push_back(where + "missing field '" + key + "'");
      return;
    }
    get(key, out);
  }
  template <typename T>
  void optional(const char* key, T& out) {
    if (j.contains(key) && !j[key].is_null()) get(key, out);
  }
  // Integers are read as 64 bits and must fit `int` (4294967302 is an error, not 6) and be integers (2.5 and
  // true are type errors, not 2 and 1); floats must be finite numbers.
  template <typename T>
  void get(const char* key, T& out) {
    const nlohmann::json& v = j[key];
    if constexpr (std::is_same_v<T, int>) {
      if (!v.is_number_integer()) return wrong_type(key, "an integer");
      if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t(INT_MAX)
                                 : v.get<int64_t>() > INT_MAX || v.get<int64_t>() < INT_MIN) {
        errors.push_back(where + "field '" + key + "' is out of range: " + v.dump() + " (at most " +
                         std::to_string(INT_MAX) + ")");
        return;
      }
      out = int(v.get<int64_t>());
    } else if constexpr (std::is_same_v<T, double>) {
      if (!v.is_number()) return wrong_type(key, "a number");
      if (!std::isfinite(v.get<double>())) {
        errors.push_back(where + "field '" + key + "' is not a finite number: " + v.dump());
        return;
      }
      out = v.get<double>();
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!v.is_boolean()) return wrong_type(key, "true or false");
      out = v.get<bool>();
    } else {
      try {
        out = v.get<T>();
      } catch (const std::exception&) {
        wrong_type(key, "a string");
      }
    }
  }
  void wrong_type(const char* key, const char* expected) {
    errors.push_back(where + "field '" + key + "' has the wrong type (" + j[key].type_name() + ": " +
                     j[key].dump() + "), expected " + expected);
  }
};

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

void check_positive(std::vector<std::string>& errors, const std::string& where, const char* name, double v) {
  if (!(v > 0)) errors.push_back(where + "'" + name + "' must be positive, got " + num(v));
}

// model_type -> family. Original LLaVA's and Mini-Gemini's top-level configs name the LLM inside theirs (llava,
// llava_llama, llava_mistral, llava_qwen; mgm = MGMLlamaForCausalLM, mgm_mistral).
LlmFamily parse_family(const nlohmann::json& j, const std::string& where, std::vector<std::string>& errors) {
  std::string type = "llama";
  Reader{j, where, errors}.optional("model_type", type);
  // Qwen2.5-VL's text model is Qwen2 with M-RoPE (its top-level config is the text config in the published files).
  if (type == "qwen2" || type == "llava_qwen" || type == "llava_qwen2" || type == "qwen2_5_vl" ||
      type == "qwen2_5_vl_text" || is_qwen3_type(type))
    return LlmFamily::kQwen2;
  if (type == "mistral" || type == "llava_mistral" || type == "mgm_mistral") return LlmFamily::kMistral;
  // γ-MoD's own: mod_llava_llama (LLaVA-1.5 / LLaVA-HR based), mod_mgm (Mini-Gemini based), both LLaMA. Other
  // methods' own LLaMA types are registered by them (model/model_types.h).
  if (type != "llama" && type != "mgm" && type != "mod_mgm" && type.rfind("llava", 0) != 0 &&
      type.rfind("mod_llava", 0) != 0 && !is_registered_llama_model_type(type))
    errors.push_back(where + "model_type '" + type + "' is not supported (llama, qwen2, mistral)");
  return LlmFamily::kLlama;
}

// rope_scaling / rope_parameters: the RoPE types transformers computes without state. "dynamic" NTK scaling
// recomputes the frequencies from the longest position seen so far (a stateful cache), so it is refused by name.
RopeScaling parse_rope_scaling(const nlohmann::json& o, const std::string& where, std::vector<std::string>& errors) {
  RopeScaling s;
  Reader r{o, where, errors};
  if (o.contains("rope_type")) r.optional("rope_type", s.type);
  else r.optional("type", s.type);
  if (s.type == "mrope") s.type = "default";  // Qwen2.5-VL's published name: default frequencies, 3-D positions
  double partial = 1.0;
  r.optional("partial_rotary_factor", partial);
  if (partial != 1.0)
    errors.push_back(where + "partial_rotary_factor " + num(partial) + " is not supported (rotary on the whole head)");
  if (s.type == "default") return s;
  if (s.type == "linear" || s.type == "llama3") {
    r.required("factor", s.factor);
    check_positive(errors, where, "factor", s.factor);
  }
  if (s.type == "llama3") {
    r.required("low_freq_factor", s.low_freq_factor);
    r.required("high_freq_factor", s.high_freq_factor);
    r.required("original_max_position_embeddings", s.original_max_position_embeddings);
    check_positive(errors, where, "low_freq_factor", s.low_freq_factor);
    check_positive(errors, where, "original_max_position_embeddings", s.original_max_position_embeddings);
    if (!(s.high_freq_factor > s.low_freq_factor))
      errors.push_back(where + "high_freq_factor (" + num(s.high_freq_factor) + ") must be larger than " +
                       "low_freq_factor (" + num(s.low_freq_factor) + ")");
  } else if (s.type == "dynamic") {
    errors.push_back(where + "rope type 'dynamic' (dynamic NTK scaling, frequencies that change with the longest "
                     "sequence seen) is not supported; supported: default, linear, llama3");
  } else if (s.type != "linear") {
    errors.push_back(where + "rope type '" + s.type + "' is not supported (default, linear, llama3)");
  }
  return s;
}

// What the families' transformers modules hard-code or read: LLaMA reads attention_bias / mlp_bias; Qwen2 always
// has q/k/v biases, no o_proj or MLP bias, and sliding windows only with use_sliding_window; Mistral has no biases
// and a sliding_window (transformers' default 4096 when the key is absent, null = full attention).
void apply_family_fields(const nlohmann::json& j, const std::string& where, LlamaConfig& c,
                         std::vector<std::string>& errors) {
  Reader r{j, where, errors};
  switch (c.family) {
    case LlmFamily::kLlama:
      r.optional("attention_bias", c.attention_bias);
      r.optional("mlp_bias", c.mlp_bias);
      break;
    case LlmFamily::kQwen2: {
      std::string type;
      if (j.contains("model_type") && j["model_type"].is_string()) type = j["model_type"];
      if (is_qwen3_type(type)) {  // Qwen3: q_norm / k_norm; attention_bias puts biases on all four projections
        c.qk_norm = true;
        r.optional("attention_bias", c.attention_bias);
      } else {
        c.qkv_bias = true;
      }
      bool window = false;
      r.optional("use_sliding_window", window);
      bool sliding_layers = false;
      if (j.contains("layer_types") && j["layer_types"].is_array())
        for (const auto& t : j["layer_types"]) sliding_layers |= t == "sliding_attention";
      if (window || sliding_layers)
        errors.push_back(where + "Qwen2 sliding-window attention (use_sliding_window: true, or 'sliding_attention' "
                         "in layer_types) is not supported");
      break;
    }
    case LlmFamily::kMistral:
      c.sliding_window = 4096;
      if (j.contains("sliding_window")) {
        if (j["sliding_window"].is_null()) c.sliding_window = 0;
        else {
          r.get("sliding_window", c.sliding_window);
          if (c.sliding_window <= 0)
            errors.push_back(where + "'sliding_window' must be positive or null, got " + j["sliding_window"].dump());
        }
      }
      break;
  }
}

}  // namespace

LlamaConfig parse_llama_config(const nlohmann::json& j, const std::string& where, std::vector<std::string>& errors) {
  LlamaConfig c;
  Reader r{j, where, errors};
  r.required("vocab_size", c.vocab_size);
  r.required("hidden_size", c.hidden_size);
  r.required("intermediate_size", c.intermediate_size);
  r.required("num_hidden_layers", c.num_hidden_layers);
  r.required("num_attention_heads", c.num_attention_heads);
  c.num_key_value_heads = c.num_attention_heads;
  r.optional("num_key_value_heads", c.num_key_value_heads);
  r.optional("head_dim", c.head_dim);
  c.family = parse_family(j, where, errors);
  if (c.family != LlmFamily::kLlama) c.rms_norm_eps = 1e-6;  // Qwen2Config's and MistralConfig's default
  r.optional("rms_norm_eps", c.rms_norm_eps);
  r.optional("rope_theta", c.rope_theta);
  // RoPE: transformers v5 writes `rope_parameters` (with rope_theta inside), older configs `rope_scaling`.
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    if (!j[key].is_object()) {
      errors.push_back(where + "field '" + key + "' must be an object, got " + j[key].dump());
      break;
    }
    if (std::string(key) == "rope_parameters") Reader{j[key], where + key + ": ", errors}.optional("rope_theta", c.rope_theta);
    c.rope_scaling = parse_rope_scaling(j[key], where + key + ": ", errors);
    if (j[key].contains("mrope_section")) {
      if (!j[key]["mrope_section"].is_array())
        errors.push_back(where + key + ": mrope_section must be a list of three integers");
      else
        for (const auto& v : j[key]["mrope_section"]) c.mrope_section.push_back(v.get<int64_t>());
    }
    Reader{j[key], where + key + ": ", errors}.optional("mrope_interleaved", c.mrope_interleaved);
    break;
  }
  r.optional("max_position_embeddings", c.max_position_embeddings);
  r.optional("tie_word_embeddings", c.tie_word_embeddings);
  apply_family_fields(j, where, c, errors);
  r.optional("initializer_range", c.initializer_range);
  // Token ids: a list (several EOS ids in newer configs) keeps the default; an integer must fit.
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer())
    r.get("bos_token_id", c.bos_token_id);
  if (j.contains("eos_token_id") && j["eos_token_id"].is_number_integer())
    r.get("eos_token_id", c.eos_token_id);
  if (j.contains("pad_token_id") && j["pad_token_id"].is_number_integer()) {
    int pad = 0;
    const size_t before = errors.size();
    r.get("pad_token_id", pad);
    if (errors.size() == before) c.pad_token_id = pad;
  }
  std::string act = "silu";
  r.optional("hidden_act", act);
  if (act != "silu") errors.push_back(where + "hidden_act '" + act + "' is not supported (LLaMA uses silu)");
  check_positive(errors, where, "vocab_size", c.vocab_size);
  check_positive(errors, where, "hidden_size", c.hidden_size);
  check_positive(errors, where, "intermediate_size", c.intermediate_size);
  check_positive(errors, where, "num_hidden_layers", c.num_hidden_layers);
  check_positive(errors, where, "num_attention_heads", c.num_attention_heads);
  check_positive(errors, where, "num_key_value_heads", c.num_key_value_heads);
  check_positive(errors, where, "rms_norm_eps", c.rms_norm_eps);
  check_positive(errors, where, "rope_theta", c.rope_theta);
  check_positive(errors, where, "max_position_embeddings", c.max_position_embeddings);
  if (c.head_dim < 0)
    errors.push_back(where + "'head_dim' must be positive, got " + std::to_string(c.head_dim));
  if (c.initializer_range < 0)
    errors.push_back(where + "'initializer_range' must be >= 0, got " + num(c.initializer_range));
  if (c.num_attention_heads > 0 && c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads != 0)
    errors.push_back(where + "num_attention_heads (" + std::to_string(c.num_attention_heads) +
                     ") is not a multiple of num_key_value_heads (" + std::to_string(c.num_key_value_heads) + ")");
  if (c.head_dim == 0 && c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads != 0)
    errors.push_back(where + "hidden_size (" + std::to_string(c.hidden_size) + ") is not a multiple of " +
                     "num_attention_heads (" + std::to_string(c.num_attention_heads) +
                     ") and no head_dim is given");
  if (c.num_attention_heads > 0 && c.head_dim >= 0 && c.dim_per_head() > 0 && c.dim_per_head() % 2 != 0)
    errors.push_back(where + "head dimension " + std::to_string(c.dim_per_head()) +
                     " must be even for rotary embeddings");
  if (c.num_attention_heads > 0 && c.head_dim == 0 && c.hidden_size > 0 && c.dim_per_head() == 0)
    errors.push_back(where + "num_attention_heads (" + std::to_string(c.num_attention_heads) +
                     ") is larger than hidden_size (" + std::to_string(c.hidden_size) + ")");
  for (auto [name, id] : {std::pair<const char*, int>{"bos_token_id", c.bos_token_id},
                          {"eos_token_id", c.eos_token_id},
                          {"pad_token_id", c.pad_token_id.value_or(0)}})
    if (c.vocab_size > 0 && (id < -1 || id >= c.vocab_size))
      errors.push_back(where + "'" + name + "' " + std::to_string(id) +
                       " is outside the vocabulary (vocab_size " + std::to_string(c.vocab_size) + ")");
  return c;
}

ClipVisionConfig parse_clip_vision_config(const nlohmann::json& j, const std::string& where,
                                          std::vector<std::string>& errors) {
  ClipVisionConfig c;
  Reader r{j, where, errors};
  r.optional("model_type", c.model_type);
  if (c.siglip()) {  // SiglipVisionConfig's defaults
    c.hidden_act = "gelu_pytorch_tanh";
    c.layer_norm_eps = 1e-6;
    c.vision_use_head = true;
    r.optional("vision_use_head", c.vision_use_head);
  } else if (c.model_type != "clip_vision_model") {
    errors.push_back(where + "vision model_type '" + c.model_type +
                     "' is not supported (clip_vision_model or siglip_vision_model)");
  }
  r.required("hidden_size", c.hidden_size);
  r.required("intermediate_size", c.intermediate_size);
  r.required("num_hidden_layers", c.num_hidden_layers);
  r.required("num_attention_heads", c.num_attention_heads);
  r.required("image_size", c.image_size);
  r.required("patch_size", c.patch_size);
  r.optional("num_channels", c.num_channels);
  r.optional("layer_norm_eps", c.layer_norm_eps);
  r.optional("hidden_act", c.hidden_act);
  r.optional("initializer_range", c.initializer_range);
  if (c.hidden_act != "quick_gelu" && c.hidden_act != "gelu" && c.hidden_act != "gelu_pytorch_tanh")
    errors.push_back(where + "vision hidden_act '" + c.hidden_act + "' is not supported");
  check_positive(errors, where, "hidden_size", c.hidden_size);
  check_positive(errors, where, "intermediate_size", c.intermediate_size);
  check_positive(errors, where, "num_hidden_layers", c.num_hidden_layers);
  check_positive(errors, where, "num_attention_heads", c.num_attention_heads);
  check_positive(errors, where, "image_size", c.image_size);
  check_positive(errors, where, "patch_size", c.patch_size);
  check_positive(errors, where, "num_channels", c.num_channels);
  check_positive(errors, where, "layer_norm_eps", c.layer_norm_eps);
  if (c.initializer_range < 0)
    errors.push_back(where + "'initializer_range' must be >= 0, got " + num(c.initializer_range));
  // SigLIP's patch conv drops the pixels past the last whole patch (siglip-so400m: 384 px, patch 14, 27^2 patches).
  if (!c.siglip() && c.patch_size > 0 && c.image_size > 0 && c.image_size % c.patch_size != 0)
    errors.push_back(where + "image_size (" + std::to_string(c.image_size) +
                     ") is not a multiple of patch_size (" + std::to_string(c.patch_size) + ")");
  else if (c.patch_size > 0 && c.image_size > 0 &&
           int64_t(c.image_size / c.patch_size) * (c.image_size / c.patch_size) > 1 << 20)
    errors.push_back(where + "image_size / patch_size gives " + std::to_string(c.image_size / c.patch_size) +
                     "^2 patches, more than 2^20 per image");
  if (c.num_attention_heads > 0 && c.hidden_size > 0 && c.hidden_size % c.num_attention_heads != 0)
    errors.push_back(where + "vision hidden_size (" + std::to_string(c.hidden_size) +
                     ") is not a multiple of " + "num_attention_heads (" +
                     std::to_string(c.num_attention_heads) + ")");
  return c;
}

int LlavaConfig::image_seq_length() const {
  if (!vision) return 0;
  if (multipath) {  // LLaVA-HR: the fast path's patches, no class token
    const int g = multipath->fast_image_size() / vision->patch_size;
    return g * g;
  }
  if (mgm) return vision->num_patches() * mgm->clip_images();  // MGM: the CLIP crops' patches, no class token
  return vision->tokens() - (vision_feature_select_strategy == "full" ? 0 : 1);
}

int LlavaConfig::image_input_size() const {
  return multipath ? multipath->input_image_size : mgm ? mgm->image_size_aux : vision ? vision->image_size : 0;
}

LlavaConfig parse_model_config(const nlohmann::json& j, const std::string& source) {
  std::vector<std::string> errors;
  LlavaConfig c;
  if (!j.is_object()) throw std::runtime_error(source + ": config is not a JSON object");
  const std::string where = source + ": ";
  std::string top_type;
  if (j.contains("model_type") && j["model_type"].is_string()) top_type = j["model_type"];
  if (top_type == "qwen2_5_vl") {  // Qwen2.5-VL: text fields in text_config (transformers 5) or at the top
    parse_qwen2_5_vl(j, where, c, errors);
  } else if (top_type == "qwen3_vl") {
    parse_qwen3_vl(j, where, c, errors);
  } else if (top_type == "qwen3_vl_moe") {
    errors.push_back(where + "model_type qwen3_vl_moe (Qwen3-VL's mixture-of-experts text model) is not supported");
  } else if (j.contains("text_config")) {  // transformers LlavaForConditionalGeneration
    if (!j["text_config"].is_object()) errors.push_back(where + "text_config is not an object");
    else c.text = parse_llama_config(j["text_config"], where + "text_config: ", errors);
    if (!j.contains("vision_config") || !j["vision_config"].is_object())
      errors.push_back(where + "missing object 'vision_config'");
    else c.vision = parse_clip_vision_config(j["vision_config"], where + "vision_config: ", errors);
    Reader r{j, where, errors};
    if (j.contains("image_token_index")) r.get("image_token_index", c.image_token_id);
    else r.optional("image_token_id", c.image_token_id);
    r.optional("projector_hidden_act", c.projector_hidden_act);
    if (j.contains("vision_feature_layer") && j["vision_feature_layer"].is_array())
      errors.push_back(where + "a list of vision_feature_layer values is not supported");
    else r.optional("vision_feature_layer", c.vision_feature_layer);
    r.optional("vision_feature_select_strategy", c.vision_feature_select_strategy);
    // Tied embeddings may be declared at the top level in LLaVA configs.
    if (j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean() &&
        !j["text_config"].contains("tie_word_embeddings"))
      c.text.tie_word_embeddings = j["tie_word_embeddings"];
    if (top_type == "llava_next" || top_type == "llava_onevision")  // AnyRes; OneVision's anyres_max_N too
      parse_llava_next_fields(j, where, /*original=*/false, c, errors);
  } else {
    c.text = parse_llama_config(j, where, errors);
    if (j.contains("mm_vision_tower") || j.contains("mm_hidden_size")) {  // original LLaVA
      Reader r{j, where, errors};
      std::string proj = "linear";
      r.optional("mm_projector_type", proj);
      c.projector_type = proj;
      int select_layer = -2;
      r.optional("mm_vision_select_layer", select_layer);
      c.vision_feature_layer = select_layer;
      std::string feature = "patch";
      r.optional("mm_vision_select_feature", feature);
      c.vision_feature_select_strategy = feature == "patch" ? "default" : "full";
      if (j.contains("vision_config") && j["vision_config"].is_object())
        c.vision = parse_clip_vision_config(j["vision_config"], where + "vision_config: ", errors);
      else
        errors.push_back(where + "original LLaVA config without 'mm_vision_tower' or an embedded 'vision_config' "
                         "(the CLIP tower; model/tower_refs.h)");
      // Original LLaVA configs carry no image token id (the code splices at its -200 marker before embedding):
      // gmod's placeholder is then vocab_size, outside the vocabulary, so no real token (added tokens included)
      // is taken for an image position.
      c.image_token_id = c.text.vocab_size;
      r.optional("image_token_id", c.image_token_id);
      if (j.contains("is_multipath_encoder") && !j["is_multipath_encoder"].is_boolean())
        errors.push_back(where + "field 'is_multipath_encoder' must be true or false");
      else if (j.value("is_multipath_encoder", false))
        parse_llava_hr_fields(j, where, c, errors);  // LLaVA-HR
      else if (j.contains("mm_vision_tower_aux") && !j["mm_vision_tower_aux"].is_null())
        parse_mgm_fields(j, where, c, errors);  // Mini-Gemini
      else if (original_config_is_anyres(j))
        parse_llava_next_fields(j, where, /*original=*/true, c, errors);  // LLaVA-NeXT
    }
  }
  // The γ-MoD config of a converted checkpoint (mod/mod_checkpoint.h reads its fields): must be an object.
  if (j.contains("mod") && !j["mod"].is_null() && !j["mod"].is_object())
    errors.push_back(where + "field 'mod' has the wrong type (" + std::string(j["mod"].type_name()) + ": " +
                     j["mod"].dump() + "), expected the MoD config object");
  if (j.contains("mod_enable") && !j["mod_enable"].is_boolean())
    errors.push_back(where + "field 'mod_enable' has the wrong type (" +
                     std::string(j["mod_enable"].type_name()) + "), expected true or false");
  // MoD layer lists: official γ-MoD's top-level mod_layers_idx, or gmod's inside "mod" (read elsewhere as
  // ints).
  for (const nlohmann::json* holder : {&j, j.contains("mod") && j["mod"].is_object() ? &j["mod"] : nullptr}) {
    if (!holder || !holder->contains("mod_layers_idx")) continue;
    const auto& idx = (*holder)["mod_layers_idx"];
    bool ok = idx.is_array();
    for (size_t i = 0; ok && i < idx.size(); ++i)
      ok = idx[i].is_number_integer() && idx[i].get<int64_t>() >= 0 &&
           idx[i].get<int64_t>() < c.text.num_hidden_layers;
    if (!ok)
      errors.push_back(where + "field '" + (holder == &j ? "" : "mod.") +
                       "mod_layers_idx' must be a list of layer " + "indices in [0, num_hidden_layers = " +
                       std::to_string(c.text.num_hidden_layers) + "), got " + idx.dump());
  }
  if (c.projector_type != "mlp2x_gelu")
    errors.push_back(where + "projector type '" + c.projector_type + "' is not supported (mlp2x_gelu)");
  if (c.projector_hidden_act != "gelu")
    errors.push_back(where + "projector_hidden_act '" + c.projector_hidden_act + "' is not supported (gelu)");
  if (c.vision_feature_select_strategy != "default" && c.vision_feature_select_strategy != "full")
    errors.push_back(where + "vision_feature_select_strategy must be 'default' or 'full'");
  if (c.vision) {
    int n = c.vision->num_hidden_layers;
    int l = c.vision_feature_layer;
    if (l < -(n + 1) || l > n) errors.push_back(where + "vision_feature_layer " + std::to_string(l) + " out of range");
    // == vocab_size: the placeholder id of models composed from parts (LLaVA keeps the LLM's vocabulary; image
    // positions are never embedded, see MultimodalLM::embed_inputs).
    if (c.image_token_id < 0 || c.image_token_id > c.text.vocab_size)
      errors.push_back(where + "image token id " + std::to_string(c.image_token_id) + " is outside the vocabulary");
    const ClipVisionConfig& v = *c.vision;
    if (v.siglip() && (c.multipath || c.mgm))
      errors.push_back(where + "a SigLIP vision tower is supported in LLaVA's single-tower layout only, not as " +
                       (c.multipath ? "LLaVA-HR's fast path" : "Mini-Gemini's low-resolution tower"));
    const int side = c.multipath ? c.multipath->fast_image_size() : v.image_size;
    if (v.patch_size > 0 && side > 0 && side % v.patch_size == 0 && c.text.max_position_embeddings > 0 &&
        int64_t(side / v.patch_size) * (side / v.patch_size) >= c.text.max_position_embeddings)
      errors.push_back(where + "one image takes " + std::to_string(side / v.patch_size) + "^2 positions, " +
                       "not fewer than max_position_embeddings (" + std::to_string(c.text.max_position_embeddings) +
                       ")");
  }
  if (!errors.empty()) {
    std::ostringstream os;
    os << "invalid model config (" << errors.size() << " problem" << (errors.size() > 1 ? "s" : "") << "):";
    for (auto& e : errors) os << "\n  " << e;
    throw std::runtime_error(os.str());
  }
  return c;
}

LlavaConfig load_model_config(const std::string& path) {
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) p /= "config.json";
  std::ifstream f(p);
  if (!f) throw std::runtime_error(p.string() + ": cannot open model config");
  nlohmann::json j;
  try {
    f >> j;
  } catch (const std::exception& e) {
    throw std::runtime_error(p.string() + ": malformed JSON: " + e.what());
  }
  resolve_tower_refs(j, p.parent_path().string(), p.string());  // towers named, not embedded (model/tower_refs.h)
  return parse_model_config(j, p.string());
}

const char* llm_model_type(LlmFamily f) {
  switch (f) {
    case LlmFamily::kQwen2: return "qwen2";
    case LlmFamily::kMistral: return "mistral";
    default: return "llama";
  }
}

const char* llm_architecture(LlmFamily f) {
  switch (f) {
    case LlmFamily::kQwen2: return "Qwen2ForCausalLM";
    case LlmFamily::kMistral: return "MistralForCausalLM";
    default: return "LlamaForCausalLM";
  }
}

nlohmann::json llama_config_to_json(const LlamaConfig& c) {
  nlohmann::json j = {{"model_type", llm_model_type(c.family)},
                      {"vocab_size", c.vocab_size},
                      {"hidden_size", c.hidden_size},
                      {"intermediate_size", c.intermediate_size},
                      {"num_hidden_layers", c.num_hidden_layers},
                      {"num_attention_heads", c.num_attention_heads},
                      {"num_key_value_heads", c.num_key_value_heads},
                      {"head_dim", c.dim_per_head()},
                      {"rms_norm_eps", c.rms_norm_eps},
                      {"rope_theta", c.rope_theta},
                      {"max_position_embeddings", c.max_position_embeddings},
                      {"tie_word_embeddings", c.tie_word_embeddings},
                      {"hidden_act", "silu"},
                      {"initializer_range", c.initializer_range},
                      {"bos_token_id", c.bos_token_id},
                      {"eos_token_id", c.eos_token_id}};
  if (c.pad_token_id) j["pad_token_id"] = *c.pad_token_id;
  switch (c.family) {
    case LlmFamily::kLlama:
      j["attention_bias"] = c.attention_bias;
      j["mlp_bias"] = c.mlp_bias;
      break;
    case LlmFamily::kQwen2:
      j["use_sliding_window"] = false;
      if (c.qk_norm) j["model_type"] = "qwen3", j["attention_bias"] = c.attention_bias;
      break;
    case LlmFamily::kMistral:
      j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
      break;
  }
  const RopeScaling& s = c.rope_scaling;
  if (s.type != "default") {  // the layout of published configs (transformers v5 reads it too)
    j["rope_scaling"] = {{"rope_type", s.type}, {"factor", s.factor}};
    if (s.type == "llama3") {
      j["rope_scaling"]["low_freq_factor"] = s.low_freq_factor;
      j["rope_scaling"]["high_freq_factor"] = s.high_freq_factor;
      j["rope_scaling"]["original_max_position_embeddings"] = s.original_max_position_embeddings;
    }
  }
  return j;
}

nlohmann::json clip_config_to_json(const ClipVisionConfig& c) {
  auto j = nlohmann::json{{"model_type", c.model_type},
          {"hidden_size", c.hidden_size},
          {"intermediate_size", c.intermediate_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"num_attention_heads", c.num_attention_heads},
          {"image_size", c.image_size},
          {"patch_size", c.patch_size},
          {"num_channels", c.num_channels},
          {"layer_norm_eps", c.layer_norm_eps},
          {"hidden_act", c.hidden_act},
          {"initializer_range", c.initializer_range}};
  if (c.siglip()) j["vision_use_head"] = c.vision_use_head;
  return j;
}

namespace {
std::vector<std::string>& llama_model_types() {
  static std::vector<std::string> t;
  return t;
}
}  // namespace

LlamaModelType::LlamaModelType(const std::string& type) { llama_model_types().push_back(type); }

bool is_registered_llama_model_type(const std::string& type) {
  const auto& t = llama_model_types();
  return std::find(t.begin(), t.end(), type) != t.end();
}

}  // namespace gmod

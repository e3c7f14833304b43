#include "model/config.h"

#include "model/llava_hr_config.h"
#include "model/mgm_config.h"

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
  r.optional("rms_norm_eps", c.rms_norm_eps);
  r.optional("rope_theta", c.rope_theta);
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {  // transformers v5 layout
    Reader rp{j["rope_parameters"], where + "rope_parameters: ", errors};
    rp.optional("rope_theta", c.rope_theta);
    std::string type = "default";
    rp.optional("rope_type", type);
    if (type != "default") errors.push_back(where + "rope_type '" + type + "' is not supported (only default RoPE)");
  }
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    std::string type = j["rope_scaling"].value("rope_type", j["rope_scaling"].value("type", std::string("?")));
    if (type != "default") errors.push_back(where + "rope_scaling type '" + type + "' is not supported");
  }
  r.optional("max_position_embeddings", c.max_position_embeddings);
  r.optional("tie_word_embeddings", c.tie_word_embeddings);
  r.optional("attention_bias", c.attention_bias);
  r.optional("mlp_bias", c.mlp_bias);
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
  if (c.hidden_act != "quick_gelu" && c.hidden_act != "gelu")
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
  if (c.patch_size > 0 && c.image_size > 0 && c.image_size % c.patch_size != 0)
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
  return vision->num_patches() + (vision_feature_select_strategy == "full" ? 1 : 0);
}

int LlavaConfig::image_input_size() const {
  return multipath ? multipath->input_image_size : mgm ? mgm->image_size_aux : vision ? vision->image_size : 0;
}

LlavaConfig parse_model_config(const nlohmann::json& j, const std::string& source) {
  std::vector<std::string> errors;
  LlavaConfig c;
  if (!j.is_object()) throw std::runtime_error(source + ": config is not a JSON object");
  const std::string where = source + ": ";
  if (j.contains("text_config")) {  // transformers LlavaForConditionalGeneration
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
        errors.push_back(where + "original LLaVA config without an embedded 'vision_config': add the CLIP "
                         "vision config of '" + j.value("mm_vision_tower", std::string("?")) + "'");
      r.optional("image_token_id", c.image_token_id);
      if (j.contains("is_multipath_encoder") && !j["is_multipath_encoder"].is_boolean())
        errors.push_back(where + "field 'is_multipath_encoder' must be true or false");
      else if (j.value("is_multipath_encoder", false))
        parse_llava_hr_fields(j, where, c, errors);  // LLaVA-HR
      else if (j.contains("mm_vision_tower_aux") && !j["mm_vision_tower_aux"].is_null())
        parse_mgm_fields(j, where, c, errors);  // Mini-Gemini
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
  return parse_model_config(j, p.string());
}

nlohmann::json llama_config_to_json(const LlamaConfig& c) {
  nlohmann::json j = {{"model_type", "llama"},
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
                      {"attention_bias", c.attention_bias},
                      {"mlp_bias", c.mlp_bias},
                      {"hidden_act", "silu"},
                      {"initializer_range", c.initializer_range},
                      {"bos_token_id", c.bos_token_id},
                      {"eos_token_id", c.eos_token_id}};
  if (c.pad_token_id) j["pad_token_id"] = *c.pad_token_id;
  return j;
}

nlohmann::json clip_config_to_json(const ClipVisionConfig& c) {
  return {{"model_type", "clip_vision_model"},
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
}

}  // namespace gmod

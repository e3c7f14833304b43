#include "model/qwen_vl_config_parse.h"

#include <nlohmann/json.hpp>

#include "model/mrope.h"
#include "model/qwen2_5_vl_config.h"
#include "model/qwen3_vl_config.h"

namespace gmod {

// Qwen2_5_VLForConditionalGeneration: the Qwen2 text model with M-RoPE, the vision encoder, no projector.
void parse_qwen2_5_vl(const nlohmann::json& j, const std::string& where, LlavaConfig& c,
                      std::vector<std::string>& errors) {
  const bool nested = j.contains("text_config") && j["text_config"].is_object();
  nlohmann::json text = nested ? j["text_config"] : j;
  if (!nested) text["model_type"] = "qwen2_5_vl_text";
  c.text = parse_llama_config(text, where + (nested ? "text_config: " : ""), errors);
  if (j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean() &&
      !(nested && j["text_config"].contains("tie_word_embeddings")))
    c.text.tie_word_embeddings = j["tie_word_embeddings"];
  if (!j.contains("vision_config") || !j["vision_config"].is_object()) {
    errors.push_back(where + "missing object 'vision_config'");
    return;
  }
  try {
    c.qwen_vision = Qwen25VisionConfig::from_json(j["vision_config"], where + "vision_config");
    c.mrope = MRopeConfig::from_json(j, where.substr(0, where.size() - 2));
  } catch (const std::exception& e) {
    errors.push_back(e.what());
    return;
  }
  c.image_token_id = static_cast<int>(c.mrope->image_token_id);
  if (c.image_token_id < 0 || c.image_token_id >= c.text.vocab_size)
    errors.push_back(where + "image_token_id " + std::to_string(c.image_token_id) + " is outside the vocabulary");
  if (c.qwen_vision->out_hidden_size != c.text.hidden_size)
    errors.push_back(where + "vision_config.out_hidden_size " + std::to_string(c.qwen_vision->out_hidden_size) +
                     " differs from the text model's hidden_size " + std::to_string(c.text.hidden_size));
  if (c.text.mrope_section != c.mrope->mrope_section)
    errors.push_back(where + "the text model has no mrope_section matching the model's");
}

// Qwen3VLForConditionalGeneration: the Qwen3 text model (q_norm / k_norm) with interleaved M-RoPE in text_config,
// the vision encoder with DeepStack, no projector.
void parse_qwen3_vl(const nlohmann::json& j, const std::string& where, LlavaConfig& c,
                    std::vector<std::string>& errors) {
  if (!j.contains("text_config") || !j["text_config"].is_object()) {
    errors.push_back(where + "missing object 'text_config' (Qwen3-VL keeps its text model there)");
    return;
  }
  nlohmann::json text = j["text_config"];
  if (!text.contains("model_type")) text["model_type"] = "qwen3_vl_text";
  if (!is_qwen3_type(text["model_type"].is_string() ? text["model_type"].get<std::string>() : ""))
    errors.push_back(where + "text_config: model_type " + text["model_type"].dump() + " is not qwen3_vl_text");
  c.text = parse_llama_config(text, where + "text_config: ", errors);
  if (j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean() &&
      !j["text_config"].contains("tie_word_embeddings"))
    c.text.tie_word_embeddings = j["tie_word_embeddings"];
  if (!j.contains("vision_config") || !j["vision_config"].is_object()) {
    errors.push_back(where + "missing object 'vision_config'");
    return;
  }
  try {
    c.qwen3_vision = Qwen3VisionConfig::from_json(j["vision_config"], where + "vision_config");
    c.mrope = MRopeConfig::from_json(j, where.substr(0, where.size() - 2));
  } catch (const std::exception& e) {
    errors.push_back(e.what());
    return;
  }
  // transformers' Qwen3VLTextRotaryEmbedding always interleaves (it ignores the flag); a file that says otherwise
  // describes a model gmod would not compute as the checkpoint was trained.
  if (text.contains("rope_parameters") || text.contains("rope_scaling")) {
    const auto& r = text.contains("rope_parameters") && text["rope_parameters"].is_object() ? text["rope_parameters"]
                                                                                             : text["rope_scaling"];
    if (r.is_object() && r.contains("mrope_interleaved") && r["mrope_interleaved"] == false)
      errors.push_back(where + "text_config: mrope_interleaved false is not Qwen3-VL's M-RoPE (transformers "
                       "always interleaves the axes)");
  }
  c.text.mrope_interleaved = true;
  c.mrope->interleaved = true;
  c.mrope->video_steps_as_frames = true;  // timestamps in the text instead of temporal ids
  c.image_token_id = static_cast<int>(c.mrope->image_token_id);
  if (c.image_token_id < 0 || c.image_token_id >= c.text.vocab_size)
    errors.push_back(where + "image_token_id " + std::to_string(c.image_token_id) + " is outside the vocabulary");
  if (c.qwen3_vision->out_hidden_size != c.text.hidden_size)
    errors.push_back(where + "vision_config.out_hidden_size " + std::to_string(c.qwen3_vision->out_hidden_size) +
                     " differs from the text model's hidden_size " + std::to_string(c.text.hidden_size));
  if (c.text.mrope_section != c.mrope->mrope_section)
    errors.push_back(where + "text_config has no mrope_section matching the model's");
  if (static_cast<int64_t>(c.qwen3_vision->deepstack_visual_indexes.size()) > c.text.num_hidden_layers)
    errors.push_back(where + "vision_config.deepstack_visual_indexes has " +
                     std::to_string(c.qwen3_vision->deepstack_visual_indexes.size()) +
                     " entries, more than the text model's " + std::to_string(c.text.num_hidden_layers) + " layers");
}

}  // namespace gmod

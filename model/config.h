// Model configuration: the LLM decoder (LLaMA-1/2/3.x, Qwen2/2.5, Mistral), the vision tower (CLIP, LLaVA-HR's
// CLIP + ConvNeXt multipath tower, or Mini-Gemini's CLIP + ConvNeXt two-path tower) and the LLaVA wiring. Plain
// structs with defaults; `load_model_config` reads a Hugging Face config.json (LlamaForCausalLM, Qwen2ForCausalLM,
// MistralForCausalLM, LlavaForConditionalGeneration, original LLaVA's or LLaVA-HR's LlavaLlamaForCausalLM, MGM's
// MGMLlamaForCausalLM) and validates it in one place.
#pragma once

#include <algorithm>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/anyres_grid.h"
#include "model/qwen2_5_vl_config.h"
#include "model/qwen3_vl_config.h"

namespace gmod {

// The decoder families gmod builds, chosen by config.json's model_type. What differs between them is data in
// LlamaConfig (biases, RoPE scaling, sliding window) that the layers read; nothing else branches on the family.
enum class LlmFamily { kLlama, kQwen2, kMistral };
const char* llm_model_type(LlmFamily f);    // "llama", "qwen2", "mistral"
const char* llm_architecture(LlmFamily f);  // "LlamaForCausalLM", ...

// RoPE frequency scaling (config.json `rope_scaling`, or transformers v5 `rope_parameters`), computed as
// transformers' ROPE_INIT_FUNCTIONS do: "default"; "linear" (every inverse frequency / factor); "llama3"
// (LLaMA-3.1/3.2: wavelengths above original_max_position_embeddings / low_freq_factor divided by factor, those
// below original_max_position_embeddings / high_freq_factor kept, a smooth interpolation between).
struct RopeScaling {
  std::string type = "default";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 0;
};

struct LlamaConfig {
  LlmFamily family = LlmFamily::kLlama;
  int vocab_size = 32000;
  int hidden_size = 4096;
  int intermediate_size = 11008;
  int num_hidden_layers = 32;
  int num_attention_heads = 32;
  int num_key_value_heads = 32;  // < num_attention_heads means grouped-query attention
  int head_dim = 0;              // 0: hidden_size / num_attention_heads
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int max_position_embeddings = 4096;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // LLaMA: biases on q/k/v/o_proj
  bool qkv_bias = false;        // Qwen2: biases on q/k/v_proj only (o_proj has none)
  int sliding_window = 0;       // > 0: a query sees only the last sliding_window positions, itself included (Mistral)
  // Qwen2.5-VL's M-RoPE (model/mrope.h): frequencies per position axis (t, h, w), summing to head_dim / 2; empty:
  // 1-D rotary. The decoder takes 3-D positions (ForwardState::mrope_positions) when this is set.
  std::vector<int64_t> mrope_section;
  // Qwen3-VL's M-RoPE: the frequencies of the three axes interleave (index i % 3 == 1 turns with the height id and
  // == 2 with the width id while i < 3 * that axis' section, every other with the temporal id) instead of lying in
  // consecutive sections (rope_parameters.mrope_interleaved).
  bool mrope_interleaved = false;
  // Qwen3: an RMSNorm over each head's query and key (self_attn.q_norm / k_norm, weight [head_dim], eps rms_norm_eps)
  // before the rotary; q/k/v/o biases only with attention_bias.
  bool qk_norm = false;
  bool mlp_bias = false;
  double initializer_range = 0.02;
  int bos_token_id = 1;
  int eos_token_id = 2;
  std::optional<int> pad_token_id;

  int dim_per_head() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
};

// The ViT towers of LLaVA: CLIP (transformers CLIPVisionModel: class token, pre-layernorm) or SigLIP
// (SiglipVisionModel: no class token, a patch conv with bias, no pre-layernorm; model/siglip.h), told apart by
// config.json's vision model_type. Their encoder layers share one layout (model/clip.h).
struct ClipVisionConfig {
  std::string model_type = "clip_vision_model";  // or "siglip_vision_model"
  int hidden_size = 1024;
  int intermediate_size = 4096;
  int num_hidden_layers = 24;
  int num_attention_heads = 16;
  int image_size = 336;
  int patch_size = 14;
  int num_channels = 3;
  double layer_norm_eps = 1e-5;
  std::string hidden_act = "quick_gelu";  // or "gelu", "gelu_pytorch_tanh" (SigLIP's)
  double initializer_range = 0.02;
  bool vision_use_head = false;  // SigLIP: the checkpoint holds the pooling head (LLaVA never runs it; not loaded)

  bool siglip() const { return model_type == "siglip_vision_model"; }
  // Tokens the tower's hidden states hold per image: the patches, plus CLIP's class token.
  int tokens() const { return num_patches() + (siglip() ? 0 : 1); }
  int num_patches() const { return (image_size / patch_size) * (image_size / patch_size); }
};

// ConvNeXt as timm builds it (patch stem, four stages; model/convnext.h). Defaults: convnext_large_mlp.
struct ConvNextConfig {
  std::vector<int> depths = {3, 3, 27, 3};
  std::vector<int> dims = {192, 384, 768, 1536};
  int in_chans = 3;
  int patch_size = 4;   // stem conv kernel = stride
  int kernel_size = 7;  // depthwise conv of every block
  int mlp_ratio = 4;
  double norm_eps = 1e-6;       // LayerNorm2d / LayerNorm (convnext_xxlarge: 1e-5)
  double ls_init_value = 1e-6;  // layer scale init (<= 0: no layer scale)
  double initializer_range = 0.02;
};

// LLaVA-HR's mixture-of-resolution tower (model/multipath_tower.h): LlavaConfig::vision is its fast CLIP path,
// this the slow ConvNeXt path and the adapters.
struct MultipathConfig {
  std::string slow_name = "convnext_large_mlp.clip_laion2b_ft_320";  // vision_tower_slow
  ConvNextConfig slow;
  int input_image_size = 1024;  // the slow path's (and the preprocessing's) image size; a multiple of 32
  bool stitch = true;           // !freeze_vision: the three stitch adapters between the CLIP quarters exist

  // The fast (CLIP) path's image size: max(input_image_size / 32 * 14, 336), as LLaVA-HR computes it.
  int fast_image_size() const { return std::max(input_image_size / 32 * 14, 336); }
};

// Mini-Gemini's (MGM) two-path tower (model/mgm_tower.h): LlavaConfig::vision is its low-resolution CLIP, this
// the high-resolution ConvNeXt ("aux") and how the low-resolution images are cut from the aux image.
struct MgmConfig {
  std::string aux_name = "openclip-convnext-large-d-320-laion2B-s29B-b131K-ft-soup";  // mm_vision_tower_aux
  ConvNextConfig aux;
  int image_size_aux = 768;  // the aux path's (and the preprocessing's) image size
  int image_grid = 1;        // the low-resolution image is image_grid x image_grid CLIP crops
  bool image_global = false;  // plus one whole-image CLIP crop (needs image_grid >= 2)
  bool optimize_vision_tower = false;      // the second half of the CLIP layers trains
  bool optimize_vision_tower_aux = false;  // the last block of every ConvNeXt stage trains

  // CLIP images per input image: the grid crops, then the global one.
  int clip_images() const { return image_grid * image_grid + (image_global ? 1 : 0); }
  int aux_channels() const {
    int s = 0;
    for (int d : aux.dims) s += d;
    return s;
  }
};

struct LlavaConfig {
  LlamaConfig text;
  std::optional<ClipVisionConfig> vision;  // absent: a text-only LLM
  std::optional<MultipathConfig> multipath;  // present: LLaVA-HR's multipath tower with `vision` as its fast path
  std::optional<MgmConfig> mgm;  // present: MGM's two-path tower with `vision` as its low-resolution CLIP
  // Qwen2.5-VL (model_type qwen2_5_vl): its vision encoder instead of `vision` (absent then), no projector, and the
  // 3-D rotary positions of image tokens (text.mrope_section, image_token_id).
  std::optional<Qwen25VisionConfig> qwen_vision;
  // Qwen3-VL (model_type qwen3_vl): its vision encoder with DeepStack (model/qwen3_vl_vision.h) instead, the Qwen3
  // text model (text.qk_norm) and interleaved M-RoPE (mrope->interleaved); `mrope` as Qwen2.5-VL's otherwise.
  std::optional<Qwen3VisionConfig> qwen3_vision;
  std::optional<MRopeConfig> mrope;
  // LLaVA-NeXT (model/llava_next.h): every image is the base image plus a grid of tiles, packed with spatial_unpad
  // and the learned image_newline; absent: one square image per image.
  std::optional<AnyresConfig> anyres;
  std::string projector_type = "mlp2x_gelu";
  std::string projector_hidden_act = "gelu";
  int image_token_id = 32000;
  int vision_feature_layer = -2;
  // "default" drops the first token of the hidden state (CLIP's class token; for SigLIP, which has none, its first
  // patch, as transformers' LLaVA does), "full" keeps it.
  std::string vision_feature_select_strategy = "default";

  // Number of LLM positions one image occupies after splicing. AnyRes (LLaVA-NeXT): the base image's share only,
  // the least an image takes; an image's own count is anyres_image_tokens (model/anyres_grid.h).
  int image_seq_length() const;
  // The side of the square images the tower takes (what preprocessing produces): CLIP's image_size,
  // LLaVA-HR's input_image_size, or MGM's image_size_aux.
  int image_input_size() const;
  // Checkpoints in the original LLaVA code's names (`model.*`, `model.mm_projector.{0,2}`), as LLaVA-HR and MGM
  // save them (model/hf_names.h, HfLayout::kLlavaHr).
  // LLaVA-NeXT loaded from the original code's layout counts too (its AnyresConfig keeps the original's unpad).
  bool original_layout() const {
    return multipath.has_value() || mgm.has_value() || (anyres.has_value() && anyres->unpad_truncates);
  }
};

// One part's config; problems are appended to `errors` prefixed with `where` (e.g. "llm/config.json: ").
LlamaConfig parse_llama_config(const nlohmann::json& j, const std::string& where, std::vector<std::string>& errors);
ClipVisionConfig parse_clip_vision_config(const nlohmann::json& j, const std::string& where,
                                          std::vector<std::string>& errors);

// Parses and validates; `source` names the file in error messages. Throws listing every problem.
LlavaConfig parse_model_config(const nlohmann::json& j, const std::string& source);
LlavaConfig load_model_config(const std::string& path);  // a config.json or a directory holding one
nlohmann::json llama_config_to_json(const LlamaConfig& c);
nlohmann::json clip_config_to_json(const ClipVisionConfig& c);

}  // namespace gmod

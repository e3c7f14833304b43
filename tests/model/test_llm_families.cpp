// The LLM families beyond LLaMA-1/2 (model/config.h LlmFamily): how their published config.json files read,
// which of their options are refused by name, that an export writes back what was read, and that the parity
// fixtures (tests/fixtures/make_llm_family_fixtures.py; compared in test_hf_parity.cpp) really exercise what
// they claim: all three llama3 RoPE bands, Qwen2's biases, a Mistral window shorter than the rows; and LLaVA
// composed from parts on a Qwen2 LLM.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "model/compose.h"
#include "model/config.h"
#include "model/layers.h"
#include "model/safetensors.h"
#include "tests/common/paths.h"

namespace gmod {
namespace {

using json = nlohmann::json;

std::string error_of(const json& j) {
  try {
    parse_model_config(j, "cfg.json");
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& msg, const std::string& part) { return msg.find(part) != std::string::npos; }

// The fields of the published meta-llama/Llama-3.1-8B config.json (transformers 4.43 layout).
json llama31_8b() {
  return json::parse(
      R"({"architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "vocab_size": 128256})");
}

// Qwen/Qwen2.5-7B-Instruct's config.json.
json qwen25_7b() {
  return json::parse(
      R"({"architectures": ["Qwen2ForCausalLM"], "bos_token_id": 151643, "eos_token_id": 151645,
    "hidden_act": "silu", "hidden_size": 3584, "intermediate_size": 18944, "max_position_embeddings": 32768,
    "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072,
    "tie_word_embeddings": false, "use_sliding_window": false, "vocab_size": 152064})");
}

// mistralai/Mistral-7B-v0.1's config.json.
json mistral_7b() {
  return json::parse(R"({"architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768,
    "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
    "vocab_size": 32000})");
}

TEST(LlmFamilyConfig, PublishedConfigsReadAsTheirFamily) {
  const LlamaConfig l = parse_model_config(llama31_8b(), "cfg.json").text;
  EXPECT_EQ(l.family, LlmFamily::kLlama);
  EXPECT_EQ(l.rope_scaling.type, "llama3");
  EXPECT_EQ(l.rope_scaling.factor, 8.0);
  EXPECT_EQ(l.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(l.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(l.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(l.rope_theta, 500000.0);
  EXPECT_FALSE(l.attention_bias || l.qkv_bias);
  EXPECT_EQ(l.sliding_window, 0);

  const LlamaConfig q = parse_model_config(qwen25_7b(), "cfg.json").text;
  EXPECT_EQ(q.family, LlmFamily::kQwen2);
  EXPECT_TRUE(q.qkv_bias);
  EXPECT_FALSE(q.attention_bias);  // no o_proj bias
  EXPECT_EQ(q.sliding_window, 0);  // use_sliding_window false: sliding_window is not used
  EXPECT_EQ(q.rope_theta, 1e6);

  const LlamaConfig m = parse_model_config(mistral_7b(), "cfg.json").text;
  EXPECT_EQ(m.family, LlmFamily::kMistral);
  EXPECT_EQ(m.sliding_window, 4096);
  EXPECT_FALSE(m.attention_bias || m.qkv_bias);
}

TEST(LlmFamilyConfig, MistralWindowDefaultsAndNull) {
  json j = mistral_7b();
  j["sliding_window"] = nullptr;  // Mistral-7B-v0.2 and later: full attention
  EXPECT_EQ(parse_model_config(j, "cfg.json").text.sliding_window, 0);
  j.erase("sliding_window");  // MistralConfig's default
  EXPECT_EQ(parse_model_config(j, "cfg.json").text.sliding_window, 4096);
  j["sliding_window"] = 0;
  EXPECT_TRUE(has(error_of(j), "cfg.json: 'sliding_window' must be positive or null, got 0"));
}

TEST(LlmFamilyConfig, UnsupportedOptionsAreRefusedByName) {
  json j = llama31_8b();
  j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  EXPECT_TRUE(has(error_of(j), "cfg.json: rope_scaling: rope type 'dynamic' (dynamic NTK scaling"));
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};  // the older key
  EXPECT_TRUE(has(error_of(j),
                  "cfg.json: rope_scaling: rope type 'yarn' is not supported (default, linear, llama3)"));
  j = llama31_8b();
  j["rope_scaling"].erase("original_max_position_embeddings");
  j["rope_scaling"].erase("low_freq_factor");
  const std::string both = error_of(j);
  EXPECT_TRUE(has(both, "rope_scaling: missing field 'original_max_position_embeddings'")) << both;
  EXPECT_TRUE(has(both, "rope_scaling: missing field 'low_freq_factor'")) << both;
  j = llama31_8b();
  j["rope_scaling"]["high_freq_factor"] = 1.0;
  EXPECT_TRUE(has(error_of(j), "high_freq_factor (1) must be larger than low_freq_factor (1)"));
  j = llama31_8b();
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "linear"}, {"rope_theta", 1e4}};  // transformers v5 layout
  EXPECT_TRUE(has(error_of(j), "cfg.json: rope_parameters: missing field 'factor'"));
  j = qwen25_7b();
  j["use_sliding_window"] = true;
  EXPECT_TRUE(has(error_of(j), "Qwen2 sliding-window attention (use_sliding_window: true"));
  j = qwen25_7b();
  j["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_TRUE(has(error_of(j), "Qwen2 sliding-window attention"));
  j = qwen25_7b();
  j["model_type"] = "qwen3";
  EXPECT_TRUE(has(error_of(j), "cfg.json: model_type 'qwen3' is not supported (llama, qwen2, mistral)"));
}

TEST(LlmFamilyConfig, ExportWritesBackWhatWasRead) {
  json mistral_full = mistral_7b();
  mistral_full["sliding_window"] = nullptr;
  json linear = llama31_8b();
  linear["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  for (const json& j : {llama31_8b(), qwen25_7b(), mistral_7b(), mistral_full, linear}) {
    const LlamaConfig a = parse_model_config(j, "cfg.json").text;
    const json out = llama_config_to_json(a);
    EXPECT_EQ(out.at("model_type"), j.at("model_type"));
    const LlamaConfig b = parse_model_config(out, "export").text;
    EXPECT_EQ(b.family, a.family);
    EXPECT_EQ(b.rope_theta, a.rope_theta);
    EXPECT_EQ(b.rope_scaling.type, a.rope_scaling.type);
    EXPECT_EQ(b.rope_scaling.factor, a.rope_scaling.factor);
    EXPECT_EQ(b.rope_scaling.low_freq_factor, a.rope_scaling.low_freq_factor);
    EXPECT_EQ(b.rope_scaling.high_freq_factor, a.rope_scaling.high_freq_factor);
    EXPECT_EQ(b.rope_scaling.original_max_position_embeddings,
              a.rope_scaling.original_max_position_embeddings);
    EXPECT_EQ(b.qkv_bias, a.qkv_bias);
    EXPECT_EQ(b.attention_bias, a.attention_bias);
    EXPECT_EQ(b.sliding_window, a.sliding_window);
  }
}

// An independent loop: query i (the last lq of lk positions) sees key j iff j <= i and i - j < window.
TEST(SlidingWindow, MaskKeepsTheLastWindowKeysOfEveryQuery) {
  for (int64_t lq : {7, 1}) {  // full sequence, one decode step
    const int64_t lk = 7, window = 3;
    auto valid = at::ones({1, lk}, at::kBool);
    valid[0][0] = false;  // a left pad
    auto m = AttentionMask::causal(valid, lq, lk, lk - lq).within_window(window, lq, lk, at::kCPU).allowed;
    ASSERT_TRUE(m.sizes() == at::IntArrayRef({1, 1, lq, lk}));
    for (int64_t q = 0; q < lq; ++q)
      for (int64_t k = 0; k < lk; ++k) {
        const int64_t i = lk - lq + q;
        const bool expect = k <= i && i - k < window && (k > 0 || i == 0);
        EXPECT_EQ(m[0][0][q][k].item<bool>(), expect) << "lq " << lq << " query " << i << " key " << k;
      }
  }
}

TEST(LlmFamilyFixtures, CoverWhatTheyClaim) {
  auto cfg = [](const std::string& name) { return load_model_config(test::fixture("hf/" + name)); };
  // llama3 RoPE: wavelengths 2π/inv_freq below original/high_freq_factor (kept), above
  // original/low_freq_factor (divided) and between (smoothed) all occur, computed here in double from the
  // config alone.
  const LlamaConfig l = cfg("llama31_rope").text;
  ASSERT_EQ(l.rope_scaling.type, "llama3");
  const double orig = l.rope_scaling.original_max_position_embeddings;
  int kept = 0, divided = 0, smoothed = 0;
  for (int i = 0; i < l.dim_per_head(); i += 2) {
    const double wavelen = 2 * M_PI * std::pow(l.rope_theta, double(i) / l.dim_per_head());
    if (wavelen < orig / l.rope_scaling.high_freq_factor)
      ++kept;
    else if (wavelen > orig / l.rope_scaling.low_freq_factor)
      ++divided;
    else
      ++smoothed;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(smoothed, 0);
  SafetensorsFile rope_ref(test::fixture("hf/llama31_rope/reference.safetensors"));
  EXPECT_GT(rope_ref.tensor("input.input_ids").size(1), orig / l.rope_scaling.high_freq_factor);
  EXPECT_EQ(cfg("llama_rope_linear").text.rope_scaling.type, "linear");

  for (const char* name : {"qwen2_tied", "llava_qwen2"}) {
    const LlamaConfig q = cfg(name).text;
    EXPECT_EQ(q.family, LlmFamily::kQwen2) << name;
    EXPECT_TRUE(q.qkv_bias && !q.attention_bias && q.tie_word_embeddings) << name;
    EXPECT_EQ(q.rope_theta, 1e6) << name;
  }
  const LlamaConfig m = cfg("mistral_window").text;
  EXPECT_EQ(m.family, LlmFamily::kMistral);
  SafetensorsFile ref(test::fixture("hf/mistral_window/reference.safetensors"));
  auto mask = ref.tensor("input.attention_mask");
  EXPECT_GT(mask.sum(1).max().item<int64_t>(), 2 * m.sliding_window) << "rows longer than twice the window";
  EXPECT_EQ(mask.select(1, 0).min().item<int64_t>(), 0) << "a left-padded row";
}

// LLaVA's stage 2 composed from parts on a Qwen2 LLM (model.llm = a Qwen2ForCausalLM directory): the LLM is
// loaded bit-exactly (text rows give transformers' Qwen2 logits), and a row with an image trains the
// projector.
TEST(LlmFamilyCompose, LlavaFromPartsOnQwen2) {
  ModelParts parts;
  parts.llm = test::fixture("hf/qwen2_tied");
  parts.vision = test::fixture("parts/vision");
  auto model = load_composed(parts);
  ASSERT_EQ(model->config.text.family, LlmFamily::kQwen2);
  SafetensorsFile ref(test::fixture("hf/qwen2_tied/reference.safetensors"));
  ModelInputs text;
  text.input_ids = ref.tensor("input.input_ids").clone();
  text.attention_mask = ref.tensor("input.attention_mask").to(at::kBool);
  {
    at::NoGradGuard ng;
    auto logits = model->forward(text).logits;
    auto valid = text.attention_mask.unsqueeze(-1).expand_as(logits);
    EXPECT_LT((logits - ref.tensor("logits")).abs().masked_select(valid).max().item<double>(), 1e-5);
  }
  const int64_t n = model->config.image_seq_length(), image_id = model->config.image_token_id;
  std::vector<int64_t> row = {1, 5, 6};
  row.insert(row.end(), n, image_id);
  row.insert(row.end(), {7, 8, 9, 10});
  ModelInputs in;
  in.input_ids = at::tensor(row, at::kLong).unsqueeze(0);
  in.labels = in.input_ids.masked_fill(in.input_ids == image_id, -100);
  in.pixel_values = at::randn({1, 3, model->config.image_input_size(), model->config.image_input_size()});
  auto out = model->forward(in);
  ASSERT_TRUE(std::isfinite(out.lm_loss.item<double>()));
  out.lm_loss.backward();
  auto g = model->projector->linear_1->weight.grad();
  ASSERT_TRUE(g.defined());
  EXPECT_GT(g.abs().max().item<double>(), 0.0);
}

}  // namespace
}  // namespace gmod

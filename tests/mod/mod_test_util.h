// Shared helpers for the gmod::mod tests: the tiny LLaVA fixture's inputs with token roles, and small
// random models.
#pragma once

#include <torch/torch.h>

#include "model/config.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "model/token_roles.h"
#include "tests/common/paths.h"

namespace gmod::test {

// Roles for spliced ids: pad where the mask is off, image where id == image_id, system before the
// first image (or the first two tokens), then the rest split into a question half and an answer half.
inline at::Tensor make_roles(const at::Tensor& ids, const at::Tensor& mask, int64_t image_id) {
  const int64_t B = ids.size(0), L = ids.size(1);
  auto roles = at::zeros({B, L}, at::kChar);
  auto ia = ids.accessor<int64_t, 2>();
  auto mb = mask.to(at::kBool);
  auto ma = mb.accessor<bool, 2>();
  auto ra = roles.accessor<int8_t, 2>();
  for (int64_t b = 0; b < B; ++b) {
    int64_t n = 0, first_img = -1, last_img = -1;
    for (int64_t i = 0; i < L; ++i) {
      if (!ma[b][i]) continue;
      n = i + 1;
      if (ia[b][i] == image_id) {
        if (first_img < 0) first_img = i;
        last_img = i;
      }
    }
    const int64_t sys_end = first_img >= 0 ? first_img : std::min<int64_t>(2, n);
    const int64_t text_start = std::max(sys_end, last_img + 1);
    const int64_t q_end = text_start + (n - text_start + 1) / 2;
    for (int64_t i = 0; i < n; ++i) {
      TokenRole r = i < sys_end ? TokenRole::kSystem : i < text_start ? TokenRole::kQuestion : TokenRole::kAnswer;
      if (i >= sys_end && i < text_start) r = TokenRole::kQuestion;
      if (i >= text_start && i < q_end) r = TokenRole::kQuestion;
      if (ia[b][i] == image_id) r = TokenRole::kImage;
      ra[b][i] = static_cast<int8_t>(r);
    }
  }
  return roles;
}

// The batch a native-resolution fixture's reference.safetensors holds (input.input_ids, attention_mask,
// labels, pixel_values, image_grid_thw; the Qwen2.5-VL and Qwen3-VL generators write them), with roles for
// `model`.
inline ModelInputs native_reference_inputs(const std::string& reference, const MultimodalLM& model) {
  SafetensorsFile ref(reference);
  ModelInputs in;
  in.input_ids = ref.tensor("input.input_ids").clone();
  in.attention_mask = ref.tensor("input.attention_mask").to(at::kBool);
  in.labels = ref.tensor("input.labels").clone();
  in.pixel_values = ref.tensor("input.pixel_values").clone();
  in.image_grid_thw = ref.tensor("input.image_grid_thw").clone();
  in.token_roles = make_roles(in.input_ids, in.attention_mask, model.config.image_token_id);
  return in;
}

inline std::string llava_fixture() { return fixture("hf/llava_layer_m2"); }

inline ModelInputs fixture_inputs() {
  SafetensorsFile ref(llava_fixture() + "/reference.safetensors");
  ModelInputs in;
  in.input_ids = ref.tensor("input.input_ids").clone();
  in.attention_mask = ref.tensor("input.attention_mask").to(at::kBool);
  in.labels = ref.tensor("input.labels").clone();
  in.pixel_values = ref.tensor("input.pixel_values").clone();
  in.token_roles = make_roles(in.input_ids, in.attention_mask, load_model_config(llava_fixture()).image_token_id);
  return in;
}

// fixture_inputs without labels: a padded batch of prompts (text and image) to generate from.
inline ModelInputs fixture_prompt() {
  auto in = fixture_inputs();
  in.labels = at::Tensor();
  return in;
}

// The fixture's LLaVA architecture with `layers` decoder layers and random weights.
inline std::shared_ptr<MultimodalLM> random_llava(int layers, uint64_t seed) {
  auto cfg = load_model_config(llava_fixture());
  cfg.text.num_hidden_layers = layers;
  auto m = std::make_shared<MultimodalLM>(cfg);
  m->init_weights(seed);
  return m;
}

// A small text-only LLaMA with GQA.
inline std::shared_ptr<MultimodalLM> random_text_lm(int layers, uint64_t seed, at::ScalarType dtype = at::kFloat) {
  LlavaConfig cfg;
  cfg.text.vocab_size = 64;
  cfg.text.hidden_size = 32;
  cfg.text.intermediate_size = 48;
  cfg.text.num_hidden_layers = layers;
  cfg.text.num_attention_heads = 4;
  cfg.text.num_key_value_heads = 2;
  cfg.text.initializer_range = 0.2;
  auto m = std::make_shared<MultimodalLM>(cfg);
  m->init_weights(seed);
  m->to(dtype);
  return m;
}

// Text inputs [B, L] with right padding (`lengths`) and roles: 2 system, then image-role tokens up to
// `routable_end`, then questions / answers.
inline ModelInputs text_inputs(const std::vector<int64_t>& lengths, int64_t L, int64_t routable_end, uint64_t seed) {
  const int64_t B = static_cast<int64_t>(lengths.size());
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  ModelInputs in;
  in.input_ids = at::randint(3, 64, {B, L}, gen, at::kLong);
  in.attention_mask = at::zeros({B, L}, at::kBool);
  in.token_roles = at::zeros({B, L}, at::kChar);
  for (int64_t b = 0; b < B; ++b) {
    in.attention_mask[b].narrow(0, 0, lengths[b]).fill_(true);
    for (int64_t i = 0; i < lengths[b]; ++i) {
      TokenRole r = i < 2 ? TokenRole::kSystem
                          : i < routable_end ? TokenRole::kImage
                                             : (i < routable_end + 3 ? TokenRole::kQuestion : TokenRole::kAnswer);
      in.token_roles[b][i] = static_cast<int64_t>(r);
    }
  }
  return in;
}

inline double max_abs_valid(const at::Tensor& a, const at::Tensor& b, const at::Tensor& valid) {
  auto m = valid.to(at::kBool).unsqueeze(-1).expand_as(a);
  return (a - b).abs().masked_select(m).max().item<double>();
}

}  // namespace gmod::test

// The MoD side of Qwen3-VL (issue 45) against transformers' Qwen3VLForConditionalGeneration on the tiny
// fixture of tests/fixtures/make_qwen3_vl_fixtures.py (3 decoder layers; DeepStack after encoder blocks 0 and
// 2, added after decoder layers 0 and 1; a batch with images of three grids, left padding and a text-only
// row), references from tests/fixtures/make_qwen3_vl_mod_fixtures.py:
// - γ-MoD's ARank runs the dense model layer by layer, so it must rebuild what the forward does between
// layers
//   (DeepStack, the interleaved 3-D rotary ids): the maps it reduces equal transformers' eager maps, and the
//   maps of gmod's own forward to the bit;
// - greedy generation with images (DeepStack in the prompt's forward, mod/decode_batch.cpp) equals
// transformers'
//   generate: tokens and every step's logits, with and without the KV cache.
// Planted by hand: ARank without the DeepStack addition turns layers 1 and 2 red (both comparisons); the
// prompt's forward without DeepStack turns the generation red.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <vector>

#include "mod/arank.h"
#include "mod/generate.h"
#include "model/llava.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "tests/common/paths.h"
#include "tests/mod/mod_test_util.h"

namespace gmod {
namespace test_qwen3_vl_mod {

std::string full_dir() { return test::fixture("qwen3_vl/full"); }
std::string mod_ref() { return test::fixture("qwen3_vl/mod/reference.safetensors"); }

ModelInputs batch(const MultimodalLM& model) {
  return test::native_reference_inputs(full_dir() + "/reference.safetensors", model);
}

TEST(Qwen3VLMoD, ARankReadsTransformersMapsWithDeepStack) {
  auto model = load_pretrained(full_dir());
  ASSERT_TRUE(model->config.qwen3_vision.has_value());
  const auto in = batch(*model);
  at::NoGradGuard no_grad;
  ForwardState st;
  st.want_attn_probs = true;
  model->forward(in, st);
  const auto n_layers = model->llm->layers->size();
  ASSERT_EQ(st.attn_probs.size(), n_layers);

  std::vector<at::Tensor> seen(n_layers);
  ARankOptions opt;
  opt.on_maps = [&](int layer, const at::Tensor& maps) {
    seen.at(static_cast<size_t>(layer)) = maps.clone();
  };
  const auto r = compute_arank(*model, {in}, opt);
  ASSERT_EQ(r.layers.size(), n_layers);
  SafetensorsFile ref(mod_ref());
  for (size_t l = 0; l < n_layers; ++l) {
    ASSERT_TRUE(seen[l].defined()) << "layer " << l;
    // Same machine, same run, same kernels: the maps are the forward's to the bit.
    EXPECT_TRUE(at::equal(seen[l], st.attn_probs[l]))
        << "layer " << l << ": ARank's maps differ from the forward's by "
        << (seen[l] - st.attn_probs[l]).abs().max().item<double>();
    // transformers' eager maps over each row's real tokens (the block ARank reads).
    const auto want = ref.tensor("attn.layer" + std::to_string(l));
    double worst = 0;
    for (int64_t b = 0; b < in.input_ids.size(0); ++b) {
      const auto idx = in.attention_mask[b].nonzero().squeeze(1);
      const auto ours = seen[l][b].index_select(1, idx).index_select(2, idx);
      const auto theirs = want[b].index_select(1, idx).index_select(2, idx);
      worst = std::max(worst, (ours - theirs).abs().max().item<double>());
    }
    EXPECT_LT(worst, 1e-5) << "layer " << l << " vs transformers' attention maps";
    std::cout << "Qwen3-VL layer " << l << ": ARank " << r.layers[l].mean << ", maps vs transformers "
              << worst << "\n";
  }
}

// Rows 0 and 1 of the batch as prompts (each row's real tokens, right padding) with their images:
// transformers' generate of each alone.
TEST(Qwen3VLMoD, GreedyGenerateWithImagesMatchesTransformersGenerate) {
  auto model = load_pretrained(full_dir());
  const auto full = batch(*model);
  const auto mask = full.attention_mask;
  const int64_t n0 = mask[0].sum().item<int64_t>(), n1 = mask[1].sum().item<int64_t>();
  const int64_t L = std::max(n0, n1);
  ModelInputs p;
  p.input_ids = at::zeros({2, L}, at::kLong);
  p.attention_mask = at::zeros({2, L}, at::kBool);
  for (int64_t b = 0; b < 2; ++b) {
    const int64_t n = b == 0 ? n0 : n1;
    p.input_ids[b].narrow(0, 0, n).copy_(full.input_ids[b].masked_select(mask[b]));
    p.attention_mask[b].narrow(0, 0, n).fill_(true);
  }
  p.token_roles = test::make_roles(p.input_ids, p.attention_mask, model->config.image_token_id);
  // Rows 0 and 1 hold the first two and the third image: every image of the batch.
  p.pixel_values = full.pixel_values;
  p.image_grid_thw = full.image_grid_thw;
  SafetensorsFile ref(mod_ref());
  const int64_t T = ref.tensor("generate.row0").size(0);
  for (const bool cache : {true, false}) {
    GenerateOptions o;
    o.max_new_tokens = T;
    o.eos_token_id = -1;
    o.use_cache = cache;
    o.keep_logits = true;
    const auto res = generate(*model, p, o);
    for (int64_t b = 0; b < 2; ++b) {
      const auto want = ref.tensor("generate.row" + std::to_string(b));
      EXPECT_TRUE(res.tokens[b].equal(want))
          << "row " << b << (cache ? " cached" : " recomputed") << ": " << res.tokens[b] << " vs " << want;
      const auto wl = ref.tensor("generate.row" + std::to_string(b) + ".logits");
      double worst = 0;
      for (int64_t t = 0; t < T; ++t)
        worst =
            std::max(worst, (res.step_logits[static_cast<size_t>(t)][b] - wl[t]).abs().max().item<double>());
      EXPECT_LT(worst, 1e-5) << "row " << b << (cache ? " cached" : " recomputed");
      std::cout << "Qwen3-VL generate row " << b << (cache ? " cached" : " recomputed")
                << ": logits vs transformers " << worst << "\n";
    }
  }
}

}  // namespace test_qwen3_vl_mod
}  // namespace gmod

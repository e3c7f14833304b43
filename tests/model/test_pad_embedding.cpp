// The pad token's embedding row against transformers when pad_token_id is a real token of the text
// (tests/fixtures/make_pad_fixture.py: SmolLM2-like tied model whose pad id ends every turn and pads):
// transformers' nn.Embedding(padding_idx=pad) gives that row no gradient from lookups, so gmod must not either;
// random init zeroes the row as transformers' _init_weights does.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "model/pretrained.h"
#include "model/safetensors.h"
#include "tests/common/paths.h"

using namespace gmod;

namespace {

double rel_err(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(b.norm().item<double>(), 1e-30);
}

}  // namespace

TEST(PadEmbedding, GradientsEqualTransformersWhenPadIdIsInTheText) {
  const auto dir = test::fixture("hf/llama_pad_in_text");
  auto model = load_pretrained(dir);
  SafetensorsFile ref(dir + "/reference.safetensors");
  ASSERT_TRUE(model->config.text.pad_token_id.has_value());
  const int64_t pad = *model->config.text.pad_token_id;
  EXPECT_EQ(model->llm->padding_idx, pad);
  ModelInputs in;
  in.input_ids = ref.tensor("input.input_ids").clone();
  in.attention_mask = ref.tensor("input.attention_mask").to(at::kBool);
  in.labels = ref.tensor("input.labels").clone();
  // The fixture is only meaningful if the pad id occurs as text (not just as padding).
  ASSERT_GT((in.input_ids.eq(pad) & in.attention_mask).sum().item<int64_t>(), 0);

  auto out = model->forward(in);
  EXPECT_NEAR(out.lm_loss.item<double>(), ref.tensor("loss").item<double>(), 1e-5);
  out.lm_loss.backward();
  auto params = model->named_parameters();
  const auto g = params["llm.embed_tokens.weight"].grad();
  ASSERT_TRUE(g.defined());
  const auto r = ref.tensor("grad.model.embed_tokens.weight");
  EXPECT_LT(rel_err(g, r), 1e-5) << "whole embedding gradient";
  EXPECT_LT(rel_err(g[pad], r[pad]), 1e-5) << "pad row gradient (tied head only)";
  // Without padding_idx the pad row differs by far more than the tolerance: the test can fail.
  const auto without = ref.tensor("grad_without_padding_idx.model.embed_tokens.weight");
  EXPECT_GT(rel_err(without[pad], r[pad]), 1e-2);
  for (const char* hf : {"model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight",
                         "model.norm.weight"}) {
    std::string name = std::string("llm.") + (hf + 6);
    ASSERT_TRUE(params.contains(name)) << name;
    EXPECT_LT(rel_err(params[name].grad(), ref.tensor(std::string("grad.") + hf)), 1e-5) << name;
  }
}

TEST(PadEmbedding, RandomInitZeroesThePadRowOnly) {
  LlavaConfig c;
  c.text.vocab_size = 40;
  c.text.hidden_size = 16;
  c.text.intermediate_size = 24;
  c.text.num_hidden_layers = 1;
  c.text.num_attention_heads = 2;
  c.text.num_key_value_heads = 2;
  for (bool tied : {true, false}) {
    c.text.tie_word_embeddings = tied;
    c.text.pad_token_id = 5;
    MultimodalLM m(c);
    m.init_weights(3);
    const auto& e = m.llm->embed_tokens;
    EXPECT_EQ(e[5].abs().max().item<double>(), 0.0) << "tied " << tied;
    EXPECT_GT(e[4].abs().max().item<double>(), 0.0);
    if (!tied) {
      EXPECT_GT(m.lm_head[5].abs().max().item<double>(), 0.0) << "untied head row is initialised normally";
    }
    c.text.pad_token_id = -1;  // counts from the end, as nn.Embedding(padding_idx=-1)
    MultimodalLM last(c);
    EXPECT_EQ(last.llm->padding_idx, 39);
  }
  c.text.pad_token_id.reset();
  MultimodalLM none(c);
  none.init_weights(3);
  EXPECT_EQ(none.llm->padding_idx, -1);
  EXPECT_GT(none.llm->embed_tokens[0].abs().max().item<double>(), 0.0);
  c.text.pad_token_id = 40;
  try {
    MultimodalLM bad(c);
    FAIL() << "pad_token_id outside the vocabulary was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("pad_token_id 40"), std::string::npos) << e.what();
  }
}

TEST(PadEmbedding, LookupsOfThePadIdGiveNoGradient) {
  LlavaConfig c;
  c.text.vocab_size = 12;
  c.text.hidden_size = 8;
  c.text.intermediate_size = 8;
  c.text.num_hidden_layers = 1;
  c.text.num_attention_heads = 2;
  c.text.num_key_value_heads = 2;
  c.text.tie_word_embeddings = false;
  c.text.pad_token_id = 3;
  MultimodalLM m(c);
  m.init_weights(1);
  auto ids = at::tensor({3, 4, 3, 5}, at::kLong).view({1, 4});
  auto e = m.llm->embed(ids);
  (e * at::randn_like(e)).sum().backward();
  const auto g = m.llm->embed_tokens.grad();
  EXPECT_EQ(g[3].abs().max().item<double>(), 0.0);
  EXPECT_GT(g[4].abs().max().item<double>(), 0.0);
  EXPECT_GT(g[5].abs().max().item<double>(), 0.0);
}

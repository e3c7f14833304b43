// γ-MoD on the LLM families beyond LLaMA-1/2 (the transformers fixtures of
// tests/fixtures/make_llm_family_fixtures.py): conversion works on LLaMA-3.1 (llama3 RoPE), Qwen2 (text and
// LLaVA) and Mistral; a MoD layer at full capacity without router scaling reproduces transformers' own
// logits; a routed step skips tokens and trains the router; on Mistral, routing runs while the sequence fits
// in the sliding window and is refused by name beyond it.
#include <gtest/gtest.h>

#include "mod/conversion.h"
#include "tests/mod/mod_test_util.h"

namespace gmod {
namespace {

struct Case {
  std::shared_ptr<MultimodalLM> model;
  ModelInputs in;
  at::Tensor logits;  // transformers', fp32
};

Case load_case(const std::string& name) {
  const auto dir = test::fixture("hf/" + name);
  Case c;
  c.model = load_pretrained(dir);
  SafetensorsFile ref(dir + "/reference.safetensors");
  c.in.input_ids = ref.tensor("input.input_ids").clone();
  c.in.attention_mask = ref.tensor("input.attention_mask").to(at::kBool);
  c.in.labels = ref.tensor("input.labels").clone();
  if (ref.has("input.pixel_values")) c.in.pixel_values = ref.tensor("input.pixel_values").clone();
  c.in.token_roles = test::make_roles(c.in.input_ids, c.in.attention_mask, c.model->config.image_token_id);
  c.logits = ref.tensor("logits").clone();
  return c;
}

MoDConfig full_capacity(std::vector<int> layers) {
  MoDConfig cfg;
  cfg.mod_layers = std::move(layers);
  cfg.skip_frac = 0.0;
  cfg.scale_by_router = false;
  cfg.rope_positions = RopePositions::kOriginal;  // transformers' positions for left-padded rows too
  return cfg;
}

const char* const kFamilies[] = {"llama31_rope", "qwen2_tied", "llava_qwen2"};

TEST(MoDFamilies, FullCapacityMoDReproducesTransformersLogits) {
  for (const char* name : kFamilies) {
    Case c = load_case(name);
    convert_to_mod(*c.model, full_capacity({1}));
    ASSERT_EQ(mod_layers(*c.model).size(), 1u) << name;
    c.model->train(true);  // top-k: at skip 0 every routable token is processed
    at::NoGradGuard ng;
    ForwardState st;
    auto got = c.model->forward(c.in, st).logits;
    EXPECT_LT(test::max_abs_valid(got, c.logits, c.in.attention_mask), 1e-5) << name;
    for (const auto& t : st.tokens) EXPECT_EQ(t.processed, t.total) << name << " layer " << t.layer;
  }
}

TEST(MoDFamilies, RoutedTrainingStepSkipsTokensAndTrainsTheRouter) {
  for (const char* name : kFamilies) {
    Case c = load_case(name);
    MoDConfig cfg;
    cfg.mod_layers = {1};
    cfg.skip_frac = 0.5;
    convert_to_mod(*c.model, cfg);
    c.model->train(true);
    ForwardState st;
    auto out = c.model->forward(c.in, st);
    auto loss = out.lm_loss + total_routing_loss(st, cfg);
    ASSERT_TRUE(std::isfinite(loss.item<double>())) << name;
    loss.backward();
    bool skipped = false;
    for (const auto& t : st.tokens) skipped |= t.processed < t.total;
    EXPECT_TRUE(skipped) << name;
    auto g = shared_router(*c.model)->weight.grad();
    ASSERT_TRUE(g.defined()) << name;
    EXPECT_GT(g.abs().max().item<double>(), 0.0) << name;
  }
}

TEST(MoDFamilies, MistralRoutesWithinTheSlidingWindowAndRefusesBeyondIt) {
  Case c = load_case("mistral_window");
  const int64_t W = c.model->config.text.sliding_window;
  ASSERT_EQ(W, 5);
  convert_to_mod(*c.model, full_capacity({1}));
  c.model->train(true);
  at::NoGradGuard ng;
  try {
    c.model->forward(c.in);
    ADD_FAILURE() << "a MoD forward over rows longer than the window must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("MoD layer 1: a sequence of 17 tokens is longer than the LLM's "
                                         "sliding_window (5)"),
              std::string::npos)
        << e.what();
  }
  // Rows 0 and 1 start unpadded: their first W tokens are a causal prefix, whose transformers logits are the
  // fixture's first W positions.
  ModelInputs in;
  in.input_ids = c.in.input_ids.narrow(0, 0, 2).narrow(1, 0, W).clone();
  in.attention_mask = c.in.attention_mask.narrow(0, 0, 2).narrow(1, 0, W).clone();
  ASSERT_TRUE(in.attention_mask.all().item<bool>());
  in.token_roles = test::make_roles(in.input_ids, in.attention_mask, c.model->config.image_token_id);
  auto got = c.model->forward(in).logits;
  EXPECT_LT((got - c.logits.narrow(0, 0, 2).narrow(1, 0, W)).abs().max().item<double>(), 1e-5);
}

}  // namespace
}  // namespace gmod

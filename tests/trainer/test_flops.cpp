// Training FLOPs behind MFU (trainer/flops.h): forward x3 for trainable parts, x2 projections / x3 attention pairs
// for frozen parts that gradients flow through, x1 for frozen parts with nothing trainable before them; MoD and
// dense on the same formula. Expected values derived by hand from the forward figures of
// tests/mod/test_accounting.cpp (HandDerivedForwardFlops): layer 0 dense 6400 + 288, layer 1 MoD 3840 + 128
// (dense 6400 + 288), head 800; vision 2064 and projector 768 per image.
#include <gtest/gtest.h>

#include "mod/conversion.h"
#include "trainer/flops.h"
#include "tests/mod/mod_test_util.h"

using namespace gmod;

namespace {

ComputeReport forward_report(bool with_image) {
  LlavaConfig c;
  c.text.vocab_size = 10;
  c.text.hidden_size = 8;
  c.text.intermediate_size = 16;
  c.text.num_hidden_layers = 2;
  c.text.num_attention_heads = 2;
  c.text.num_key_value_heads = 2;
  ClipVisionConfig v;
  v.hidden_size = 4;
  v.intermediate_size = 8;
  v.num_hidden_layers = 2;
  v.num_attention_heads = 1;
  v.image_size = 4;
  v.patch_size = 2;
  c.vision = v;
  return account_forward({{0, 5, 5}, {1, 3, 5, 4}}, c, ForwardShape::full({3, 2}, with_image ? 1 : 0));
}

TrainableParts parts(bool vision, bool projector, bool embedding, bool head, std::vector<bool> layers) {
  TrainableParts p;
  p.vision = vision, p.projector = projector, p.embedding = embedding, p.head = head, p.layers = std::move(layers);
  return p;
}

}  // namespace

TEST(TrainFlops, HandDerivedMultipliers) {
  const auto text = forward_report(false);
  // Everything in the LLM trains: 3 x (6688 + 3968 + 800); dense 3 x (2 * 6688 + 800).
  auto f = train_flops(text, parts(false, false, true, true, {true, true}));
  EXPECT_DOUBLE_EQ(f.flops, 3 * 11456.0);
  EXPECT_DOUBLE_EQ(f.dense_flops, 3 * 14176.0);
  // Only the head trains: the layers see no gradient (forward only), head x3.
  f = train_flops(text, parts(false, false, false, true, {false, false}));
  EXPECT_DOUBLE_EQ(f.flops, 6688.0 + 3968.0 + 3 * 800.0);
  // Only layer 0 trains: layer 0 x3; layer 1 frozen under it: 2 x 3840 + 3 x 128; frozen head: 2 x 800.
  f = train_flops(text, parts(false, false, false, false, {true, false}));
  EXPECT_DOUBLE_EQ(f.flops, 3 * 6688.0 + (2 * 3840.0 + 3 * 128.0) + 2 * 800.0);
  EXPECT_DOUBLE_EQ(f.dense_flops, 3 * 6688.0 + (2 * 6400.0 + 3 * 288.0) + 2 * 800.0);

  // Stage 1 (only the projector trains) on a batch with an image: frozen vision tower forward only (2064),
  // projector x3 (3 x 768), frozen LLM layers with gradients flowing: projections x2, pairs x3; head x2.
  const auto img = forward_report(true);
  f = train_flops(img, parts(false, true, false, false, {false, false}));
  const double layers = (2 * 6400.0 + 3 * 288.0) + (2 * 3840.0 + 3 * 128.0);
  EXPECT_DOUBLE_EQ(f.flops, 2064.0 + 3 * 768.0 + layers + 2 * 800.0);
  // LLaVA SFT: frozen tower, the rest trains.
  f = train_flops(img, parts(false, true, true, true, {true, true}));
  EXPECT_DOUBLE_EQ(f.flops, 2064.0 + 3 * (768.0 + 11456.0));
  // The same step without its image: stage 1 has nothing trainable under the LLM, so it is forward only.
  f = train_flops(text, parts(false, true, false, false, {false, false}));
  EXPECT_DOUBLE_EQ(f.flops, 11456.0);
}

TEST(TrainFlops, PartsFromRequiresGradAndTiedHead) {
  auto m = test::random_llava(2, 1);
  for (auto& p : m->named_parameters()) p.value().set_requires_grad(p.key().rfind("llm.layers.1.", 0) == 0 ||
                                                                     p.key().rfind("projector.", 0) == 0);
  auto t = TrainableParts::of(*m, 2, m->config.text.tie_word_embeddings);
  EXPECT_FALSE(t.vision);
  EXPECT_TRUE(t.projector);
  EXPECT_FALSE(t.embedding);
  EXPECT_FALSE(t.head);
  EXPECT_EQ(t.layers, (std::vector<bool>{false, true}));
  t = TrainableParts::of(*m, 2, /*tied_head=*/true);
  EXPECT_FALSE(t.head);
  m->llm->embed_tokens.set_requires_grad(true);
  EXPECT_TRUE(TrainableParts::of(*m, 2, true).head);  // a tied head trains with the embedding
}

TEST(TrainFlops, MoDStepIsCreditedOnlyItsWorkAndDenseItsOwn) {
  auto in = test::text_inputs({16, 12}, 16, 10, 6);
  auto dense = test::random_text_lm(4, 2);
  auto mod = test::random_text_lm(4, 2);
  MoDConfig cfg;
  cfg.mod_layers = {1, 2};
  convert_to_mod(*mod, cfg);
  const auto shape = ForwardShape::full(sample_lengths(in.attention_mask));
  ForwardState sd, sm;
  dense->forward(in, sd);
  mod->forward(in, sm);
  const auto pd = TrainableParts::of(*dense, 4, dense->config.text.tie_word_embeddings);
  const auto fd = train_flops(account_forward(sd.tokens, dense->config, shape), pd);
  const auto fm = train_flops(account_forward(sm.tokens, mod->config, shape), pd);
  EXPECT_DOUBLE_EQ(fd.flops, fd.dense_flops);
  EXPECT_DOUBLE_EQ(fm.dense_flops, fd.flops);
  EXPECT_LT(fm.flops, 0.95 * fm.dense_flops);
}

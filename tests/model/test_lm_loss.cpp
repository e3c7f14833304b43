// The label-only chunked LM loss (model/lm_loss.h) against the full-logits path (MultimodalLM::forward +
// causal_lm_loss_sum, itself checked against transformers in test_hf_parity.cpp) as the oracle: the same
// loss and the same gradient of every parameter, at several chunk sizes, fp32 and bf16, tied embeddings,
// images, padding and batches without any label.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>

#include "model/config.h"
#include "model/lm_loss.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "tests/common/paths.h"

using namespace gmod;

namespace {

struct Result {
  double loss_sum = 0;
  int64_t supervised = 0;
  std::map<std::string, at::Tensor> grads;
};

// One forward + backward of `scale` * lm_loss_sum; chunk < 0 = the full-logits oracle.
Result run(MultimodalLM& m, const ModelInputs& in, int64_t chunk, double scale = 0.37) {
  m.zero_grad();
  ForwardState st;
  ModelOutput out = chunk < 0 ? m.forward(in, st) : forward_label_loss(m, in, st, chunk);
  if (chunk >= 0) {
    EXPECT_FALSE(out.logits.defined()) << "the training path must not build logits";
  }
  EXPECT_EQ(out.lm_loss_sum.scalar_type(), at::kFloat);
  (out.lm_loss_sum * scale).backward();
  Result r;
  r.loss_sum = out.lm_loss_sum.item<double>();
  r.supervised = out.supervised_tokens;
  for (const auto& p : m.named_parameters())
    if (p.value().grad().defined()) r.grads[p.key()] = p.value().grad().to(at::kFloat).clone();
  return r;
}

// |a - b| <= tol * max(max|b|, floor) for every parameter that the oracle gave a gradient.
void expect_same(const Result& want, const Result& got, double tol, const std::string& what) {
  EXPECT_EQ(got.supervised, want.supervised) << what;
  EXPECT_NEAR(got.loss_sum, want.loss_sum, tol * std::max(1.0, std::abs(want.loss_sum))) << what << ": loss";
  ASSERT_EQ(got.grads.size(), want.grads.size()) << what;
  for (const auto& [name, g] : want.grads) {
    ASSERT_TRUE(got.grads.count(name)) << what << ": no gradient for " << name;
    const double ref = std::max(g.abs().max().item<double>(), 1e-6);
    const double diff = (got.grads.at(name) - g).abs().max().item<double>();
    EXPECT_LE(diff, tol * ref) << what << ": gradient of " << name << " (max |ref| " << ref << ")";
  }
}

LlavaConfig text_config(bool tied) {
  LlavaConfig c;
  c.text.vocab_size = 97;
  c.text.hidden_size = 32;
  c.text.intermediate_size = 48;
  c.text.num_hidden_layers = 2;
  c.text.num_attention_heads = 4;
  c.text.num_key_value_heads = 2;
  c.text.initializer_range = 0.2;
  c.text.tie_word_embeddings = tied;
  return c;
}

// Right-padded batch: lengths 12, 9, 5 of L = 12; labels on the second half of each row, -100 elsewhere.
ModelInputs text_batch(int64_t V, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const std::vector<int64_t> lengths = {12, 9, 5};
  const int64_t B = 3, L = 12;
  ModelInputs in;
  in.input_ids = at::randint(3, V, {B, L}, gen, at::kLong);
  in.attention_mask = at::zeros({B, L}, at::kBool);
  in.labels = at::full({B, L}, -100, at::kLong);
  for (int64_t b = 0; b < B; ++b) {
    in.attention_mask[b].narrow(0, 0, lengths[b]).fill_(true);
    const int64_t a = lengths[b] / 2;
    in.labels[b].narrow(0, a, lengths[b] - a).copy_(in.input_ids[b].narrow(0, a, lengths[b] - a));
  }
  return in;
}

std::shared_ptr<MultimodalLM> model(const LlavaConfig& c, at::ScalarType dtype, uint64_t seed = 5) {
  auto m = std::make_shared<MultimodalLM>(c);
  m->init_weights(seed);
  m->to(dtype);
  m->train();
  return m;
}

}  // namespace

TEST(LabelOnlyLmLoss, Fp32MatchesFullLogitsAtEveryChunkSize) {
  auto m = model(text_config(false), at::kFloat);
  const ModelInputs in = text_batch(97, 11);
  const Result want = run(*m, in, -1);
  ASSERT_EQ(want.supervised, 6 + 5 + 3);  // row b: len - len/2 labelled positions, none at t = 0
  for (int64_t chunk : {1, 4, 7, 0})
    expect_same(want, run(*m, in, chunk), 2e-5, "chunk " + std::to_string(chunk));
}

TEST(LabelOnlyLmLoss, TiedEmbeddingsGetBothGradients) {
  auto m = model(text_config(true), at::kFloat);
  const ModelInputs in = text_batch(97, 12);
  const Result want = run(*m, in, -1);
  ASSERT_TRUE(want.grads.count("llm.embed_tokens.weight"));
  for (int64_t chunk : {3, 0})
    expect_same(want, run(*m, in, chunk), 2e-5, "tied, chunk " + std::to_string(chunk));
}

// bf16: every GEMM runs in bf16 in both paths; what differs is the order of fp32 sums and, with several
// chunks, the head weight's gradient being rounded to bf16 once per chunk before the fp32 sum.
TEST(LabelOnlyLmLoss, Bf16MatchesFullLogitsWithinBf16RoundOff) {
  for (bool tied : {false, true}) {
    auto m = model(text_config(tied), at::kBFloat16);
    const ModelInputs in = text_batch(97, 13);
    const Result want = run(*m, in, -1);
    expect_same(want, run(*m, in, 0), 1e-2, std::string("bf16 one chunk") + (tied ? " tied" : ""));
    expect_same(want, run(*m, in, 4), 2e-2, std::string("bf16 chunk 4") + (tied ? " tied" : ""));
  }
}

TEST(LabelOnlyLmLoss, ImagesAndTheFixtureLabelsMatchFullLogits) {
  const std::string dir = test::fixture("hf/llava_layer_m2");
  auto m = model(load_model_config(dir), at::kFloat, 21);
  SafetensorsFile ref(dir + "/reference.safetensors");
  ModelInputs in;
  in.input_ids = ref.tensor("input.input_ids").clone();
  in.attention_mask = ref.tensor("input.attention_mask").to(at::kBool);
  in.labels = ref.tensor("input.labels").clone();
  in.pixel_values = ref.tensor("input.pixel_values").clone();
  const Result want = run(*m, in, -1);
  ASSERT_GT(want.supervised, 0);
  ASSERT_TRUE(want.grads.count("vision.vision_model.encoder.layers.0.self_attn.q_proj.weight"));
  for (int64_t chunk : {5, 0})
    expect_same(want, run(*m, in, chunk), 2e-5, "llava, chunk " + std::to_string(chunk));
}

TEST(LabelOnlyLmLoss, NoLabelGivesZeroLossAndZeroGradients) {
  auto m = model(text_config(false), at::kFloat);
  ModelInputs in = text_batch(97, 14);
  in.labels.fill_(-100);
  const Result want = run(*m, in, -1);
  const Result got = run(*m, in, 2);
  EXPECT_EQ(got.supervised, 0);
  EXPECT_EQ(got.loss_sum, 0.0);
  expect_same(want, got, 0.0, "no label");
}

TEST(LabelOnlyLmLoss, FrozenHeadAndDecoderStillTrainTheEmbeddingPath) {
  // Only the embeddings train (everything after them frozen): the head gets no gradient, the hidden rows do.
  auto m = model(text_config(false), at::kFloat);
  for (auto& p : m->named_parameters()) p.value().set_requires_grad(p.key() == "llm.embed_tokens.weight");
  const ModelInputs in = text_batch(97, 15);
  const Result want = run(*m, in, -1);
  ASSERT_EQ(want.grads.size(), 1u);
  expect_same(want, run(*m, in, 3), 2e-5, "frozen head");
}

TEST(LabelOnlyLmLoss, BadShapesAreNamed) {
  auto h = at::zeros({2, 5, 8});
  auto w = at::zeros({11, 8});
  auto labels = at::zeros({2, 4}, at::kLong);
  try {
    label_only_lm_loss_sum(h, w, labels);
    FAIL() << "no error for labels [2, 4] against hidden [2, 5, 8]";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 4]"), std::string::npos) << e.what();
  }
  try {
    label_only_lm_loss_sum(h, at::zeros({11, 7}), at::zeros({2, 5}, at::kLong));
    FAIL() << "no error for a [11, 7] head";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("head weight [11, 7]"), std::string::npos) << e.what();
  }
}

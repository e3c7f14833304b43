// Generation with KV caches against full recomputation: dense, MoD without skipping, and MoD with
// skipping (recomputed with the same routing decisions replayed).
#include <gtest/gtest.h>

#include "mod/conversion.h"
#include "mod/generate.h"
#include "tests/mod/mod_test_util.h"

using namespace gmod;

namespace {

ModelInputs prompt() {
  auto in = test::fixture_inputs();
  in.labels = at::Tensor();
  return in;
}

GenerateOptions opts(bool cache) {
  GenerateOptions o;
  o.max_new_tokens = 6;
  o.eos_token_id = -1;
  o.use_cache = cache;
  o.keep_logits = true;
  return o;
}

void expect_same(const GenerateResult& a, const GenerateResult& b, double tol) {
  EXPECT_TRUE(at::equal(a.tokens, b.tokens));
  ASSERT_EQ(a.step_logits.size(), b.step_logits.size());
  for (size_t t = 0; t < a.step_logits.size(); ++t)
    EXPECT_LT((a.step_logits[t] - b.step_logits[t]).abs().max().item<double>(), tol) << "step " << t;
}

}  // namespace

TEST(Generate, DenseKvCacheEqualsRecomputation) {
  auto model = load_pretrained(test::llava_fixture());
  model->eval();
  auto p = prompt();
  auto cached = generate(*model, p, opts(true));
  auto full = generate(*model, p, opts(false));
  EXPECT_EQ(cached.tokens.sizes(), (std::vector<int64_t>{3, 6}));
  expect_same(cached, full, 1e-4);
}

TEST(Generate, ModWithoutSkippingEqualsRecomputation) {
  auto model = test::random_llava(4, 3);
  MoDConfig cfg;
  cfg.mod_layers = {1, 2, 3};
  cfg.infer_threshold = 0.0;
  cfg.decode_threshold = 0.0;
  convert_to_mod(*model, cfg);
  model->eval();
  auto p = prompt();
  auto cached = generate(*model, p, opts(true));
  auto full = generate(*model, p, opts(false));
  expect_same(cached, full, 1e-4);
  for (const auto& t : cached.layer_tokens) EXPECT_EQ(t.processed, t.total);
}

TEST(Generate, ModWithSkippingEqualsRecomputationWithSameDecisions) {
  auto model = test::random_llava(4, 3);
  MoDConfig cfg;
  cfg.mod_layers = {1, 2, 3};
  cfg.infer_threshold = 0.5;  // skip at prefill too
  convert_to_mod(*model, cfg);
  {
    at::NoGradGuard ng;
    shared_router(*model)->weight.mul_(40.0);  // spread p around 0.5
  }
  model->eval();
  auto layers = mod_layers(*model);
  for (auto& l : layers) l->record_selection = true;
  auto p = prompt();
  auto cached = generate(*model, p, opts(true));
  const int64_t B = 3, L = p.input_ids.size(1), T = cached.tokens.size(1);

  // Replay: prefill decisions [B, L] followed by one [B, 1] per fed generated token.
  int64_t skipped_prefill = 0, skipped_decode = 0;
  auto valid = p.attention_mask;
  for (auto& l : layers) {
    ASSERT_EQ(static_cast<int64_t>(l->recorded.size()), T);
    skipped_prefill += (valid & l->recorded[0].logical_not()).sum().item<int64_t>();
    for (int64_t t = 1; t < T; ++t) skipped_decode += l->recorded[t].logical_not().sum().item<int64_t>();
    l->forced_selection = at::cat(l->recorded, 1);
    l->record_selection = false;
  }
  EXPECT_GT(skipped_prefill, 0);
  EXPECT_GT(skipped_decode, 0);

  auto n = valid.sum(1);
  ModelInputs full = p;
  auto fed = cached.tokens.narrow(1, 0, T - 1);
  full.input_ids = at::cat({p.input_ids, fed}, 1);
  full.attention_mask = at::cat({valid, at::ones({B, T - 1}, at::kBool)}, 1);
  full.positions = at::cat({at::arange(L).unsqueeze(0).expand({B, L}), n.unsqueeze(1) + at::arange(T - 1).unsqueeze(0)}, 1);
  full.token_roles = at::cat({p.token_roles, at::full({B, T - 1}, static_cast<int64_t>(TokenRole::kAnswer), at::kChar)}, 1);
  at::NoGradGuard ng;
  auto logits = model->forward(full).logits;  // [B, L + T - 1, V]
  for (int64_t t = 0; t < T; ++t) {
    auto at_pos = t == 0 ? (n - 1) : at::full({B}, L + t - 1, at::kLong);
    auto ref = logits.gather(1, at_pos.view({B, 1, 1}).expand({B, 1, logits.size(2)})).squeeze(1);
    EXPECT_LT((cached.step_logits[t] - ref).abs().max().item<double>(), 1e-4) << "step " << t;
  }
}

TEST(Generate, TopPSamplingIsSeededAndTinyTopPIsGreedy) {
  auto model = load_pretrained(test::llava_fixture());
  model->eval();
  auto p = prompt();
  auto o = opts(true);
  auto greedy = generate(*model, p, o);
  o.greedy = false;
  o.top_p = 1e-9;
  EXPECT_TRUE(at::equal(generate(*model, p, o).tokens, greedy.tokens));
  o.top_p = 0.9;
  o.temperature = 1.5;
  o.seed = 17;
  auto a = generate(*model, p, o), b = generate(*model, p, o);
  EXPECT_TRUE(at::equal(a.tokens, b.tokens));
  auto logits = at::tensor({0.0, 5.0, 4.9, -3.0}).view({1, 4});
  GenerateOptions s;
  s.greedy = false;
  s.top_p = 0.5;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(choose_next_tokens(logits, s, gen).item<int64_t>(), 1);
}

TEST(Generate, OnStepSeesEachStepsTokensAndFalseStopsAfterThatStep) {
  auto model = load_pretrained(test::llava_fixture());
  model->eval();
  auto p = prompt();
  const auto whole = generate(*model, p, opts(true));  // 6 steps, no callback
  auto o = opts(true);
  std::vector<at::Tensor> seen;
  o.on_step = [&](int64_t step, const at::Tensor& next) {
    EXPECT_EQ(step, int64_t(seen.size()));
    seen.push_back(next.clone());
    return step < 2;  // false at step 2: three steps in all
  };
  const auto cut = generate(*model, p, o);
  ASSERT_EQ(seen.size(), 3u);
  ASSERT_EQ(cut.tokens.size(1), 3);
  for (int64_t t = 0; t < 3; ++t) {
    EXPECT_TRUE(at::equal(seen[size_t(t)], whole.tokens.select(1, t))) << "step " << t;
    EXPECT_TRUE(at::equal(cut.tokens.select(1, t), whole.tokens.select(1, t))) << "step " << t;
  }
}

// Generation with KV caches against full recomputation: dense, MoD without skipping, and MoD with
// skipping (recomputed with the same routing decisions replayed).
#include <gtest/gtest.h>

#include "mod/conversion.h"
#include "mod/generate.h"
#include "tests/mod/decode_replay.h"
#include "tests/mod/mod_test_util.h"

using namespace gmod;

namespace {

constexpr auto prompt = &test::fixture_prompt;

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

namespace {

// The replay check (tests/mod/decode_replay.h) with this file's options, a given EOS and length; the skipping
// models here skip at prefill too.
test::DecodeCases expect_replay_equal(MultimodalLM& model, const ModelInputs& p, int64_t eos, int64_t max_new) {
  auto o = opts(true);
  o.eos_token_id = eos;
  o.max_new_tokens = max_new;
  const auto cases = test::expect_replay_equal(model, p, o);
  EXPECT_GT(cases.skipped_prefill, 0);
  return cases;
}

std::shared_ptr<MultimodalLM> skipping_mod_model(double router_scale) {
  auto model = test::random_llava(4, 3);
  MoDConfig cfg;
  cfg.mod_layers = {1, 2, 3};
  cfg.infer_threshold = 0.5;  // skip at prefill too
  convert_to_mod(*model, cfg);
  {
    at::NoGradGuard ng;
    shared_router(*model)->weight.mul_(router_scale);  // spread p around 0.5
  }
  model->eval();
  return model;
}

}  // namespace

TEST(Generate, ModWithSkippingEqualsRecomputationWithSameDecisions) {
  auto model = skipping_mod_model(40.0);
  auto cases = expect_replay_equal(*model, prompt(), -1, 6);
  // The decode step's paths: mixed routed and skipped samples, all routed (samples with unequal cached lengths:
  // one masked attention run).
  EXPECT_GT(cases.some, 0);
  EXPECT_GT(cases.all, 0);
  // Processing samples that are not consecutive (attention in several runs over views of the caches): the batch
  // twice over decides alike for sample b and b + 3, so any step where some samples process has such a split.
  auto p = prompt(), twice = p;
  twice.input_ids = at::cat({p.input_ids, p.input_ids});
  twice.attention_mask = at::cat({p.attention_mask, p.attention_mask});
  twice.pixel_values = at::cat({p.pixel_values, p.pixel_values});
  twice.token_roles = at::cat({p.token_roles, p.token_roles});
  EXPECT_GT(expect_replay_equal(*model, twice, -1, 6).split_runs, 0);
  // No sample routed at any decode step: every MoD layer skips its matmuls at every step.
  for (auto& l : mod_layers(*model)) l->cfg.decode_threshold = 1.01;
  cases = expect_replay_equal(*model, prompt(), -1, 6);
  EXPECT_EQ(cases.none, 3 * 5);
  EXPECT_EQ(cases.some + cases.all, 0);
}

TEST(Generate, ModSamplesFinishingAtDifferentStepsEqualRecomputation) {
  auto model = skipping_mod_model(40.0);
  auto p = prompt();
  // An EOS that one sample generates early and the others later or never: the token sample 0 generates at step 2.
  auto free_run = generate(*model, p, opts(true));
  const int64_t eos = free_run.tokens[0][2].item<int64_t>();
  auto cases = expect_replay_equal(*model, p, eos, 10);
  auto o = opts(true);
  o.eos_token_id = eos;
  o.max_new_tokens = 10;
  auto r = generate(*model, p, o);
  EXPECT_LE(r.lengths[0].item<int64_t>(), 3);
  EXPECT_GT(r.lengths.max().item<int64_t>(), r.lengths.min().item<int64_t>()) << "samples must finish apart";
  EXPECT_GT(cases.some + cases.all, 0);
}

TEST(Generate, DenseSamplesFinishingAtDifferentStepsEqualRecomputation) {
  auto model = load_pretrained(test::llava_fixture());
  model->eval();
  auto p = prompt();
  auto free_run = generate(*model, p, opts(true));
  auto o = opts(true);
  o.eos_token_id = free_run.tokens[1][1].item<int64_t>();
  o.max_new_tokens = 8;
  auto cached = generate(*model, p, o);
  auto r = opts(false);
  r.eos_token_id = o.eos_token_id;
  r.max_new_tokens = 8;
  auto full = generate(*model, p, r);
  EXPECT_TRUE(at::equal(cached.lengths, full.lengths));
  EXPECT_GT(cached.lengths.max().item<int64_t>(), cached.lengths.min().item<int64_t>()) << "samples must finish apart";
  EXPECT_TRUE(at::equal(cached.tokens, full.tokens));
  ASSERT_EQ(cached.step_logits.size(), full.step_logits.size());
  for (size_t t = 0; t < cached.step_logits.size(); ++t)
    for (int64_t b = 0; b < cached.tokens.size(0); ++b)
      if (static_cast<int64_t>(t) < cached.lengths[b].item<int64_t>()) {  // finished samples' logits are of pads
        EXPECT_LT((cached.step_logits[t][b] - full.step_logits[t][b]).abs().max().item<double>(), 1e-4)
            << "step " << t << " sample " << b;
      }
  EXPECT_GT(cached.prefill_seconds, 0.0);
  EXPECT_GT(cached.decode_seconds, 0.0);
  EXPECT_EQ(cached.decode_steps, cached.lengths.max().item<int64_t>() - 1);
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

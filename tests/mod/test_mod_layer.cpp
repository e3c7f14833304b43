// The MoD layer: compaction round trip, skipped tokens untouched, per-sample capacity, equality with
// the dense model at full capacity, routing-loss gradients against finite differences, accounting.
#include <gtest/gtest.h>

#include "mod/accounting.h"
#include "mod/conversion.h"
#include "tests/mod/mod_test_util.h"

using namespace gmod;

// A named namespace around the file keeps its helpers apart from other files in a unity build.
namespace test_mod_layer {
namespace {

ForwardState layer_state(MultimodalLM& m, const ModelInputs& in, at::ScalarType dt) {
  ForwardState st;
  prepare_forward_state(st, in.input_ids, in.attention_mask, in.positions);
  st.token_roles = in.token_roles;
  st.rope = &m.llm->rope;
  std::tie(st.cos, st.sin) = m.llm->rope.cos_sin(st.positions, dt);
  return st;
}

MoDConfig gamma_cfg(std::vector<int> layers, double skip) {
  MoDConfig c;
  c.mod_layers = std::move(layers);
  c.skip_frac = skip;
  return c;
}

}  // namespace

TEST(Compaction, GatherScatterRoundTripIsExact) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  auto h = at::randn({3, 11, 5}, gen);
  auto sel = at::rand({3, 11}, gen) > 0.5;
  sel[2].fill_(false);  // a sample with nothing selected
  auto c = compact(sel);
  EXPECT_EQ(c.kmax, sel.sum(1).max().item<int64_t>());
  for (int64_t b = 0; b < 3; ++b) {
    auto expect = sel[b].nonzero().squeeze(1);
    auto got = c.index[b].narrow(0, 0, c.counts[b].item<int64_t>());
    EXPECT_TRUE(at::equal(got, expect)) << "selected positions ascending, sample " << b;
  }
  auto x = gather_tokens(h, c.index);
  EXPECT_TRUE(at::equal(scatter_tokens(h, c, x), h));
  auto moved = scatter_tokens(h, c, x + 1.0);
  auto diff = (moved - h).abs().sum(-1) > 0;  // [B, L]
  EXPECT_TRUE(at::equal(diff, sel)) << "exactly the selected rows change";
}

// The row-wise gather/scatter (index_select / index_copy on the [B·L, D] view, whose backward stays row-wise
// under deterministic CUDA) gives bitwise the values and gradients of the expanded-index gather/scatter it
// replaced.
TEST(Compaction, RowWiseGatherScatterEqualExpandedIndexBitwiseWithGradients) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  auto h0 = at::randn({3, 13, 6}, gen), w = at::randn({3, 13, 6}, gen);
  auto sel = at::rand({3, 13}, gen) > 0.4;
  sel[1].fill_(false);
  auto c = compact(sel);
  auto run = [&](bool rowwise) {
    auto h = h0.clone().requires_grad_();
    auto idx = c.index.unsqueeze(-1).expand({c.index.size(0), c.index.size(1), h.size(-1)});
    auto x = rowwise ? gather_tokens(h, c.index) : h.gather(1, idx);
    auto y = x * 2.0 + 1.0;
    at::Tensor out;
    if (rowwise) {
      out = scatter_tokens(h, c, y);
    } else {
      auto src = at::where(c.valid.unsqueeze(-1), y, h.gather(1, idx));
      out = h.scatter(1, idx, src);
    }
    (out * w).sum().backward();
    return std::make_pair(out.detach(), h.grad());
  };
  auto [a, ga] = run(true);
  auto [b, gb] = run(false);
  EXPECT_TRUE(at::equal(a, b));
  EXPECT_TRUE(at::equal(ga, gb));
}

TEST(RoutingMasks, CapacityIsPerSampleFromRoles) {
  auto in = test::text_inputs({12, 9, 5}, 12, 8, 1);  // routable = positions [0, 8)
  auto m = routing_masks(in.token_roles, in.attention_mask, 3, 12, ForcedKeep::kQuestionsAnswers, at::kCPU);
  auto k = topk_capacity(m, 0.5);
  // sample 0: 12 valid, 8 routable -> skip 4; sample 1: 9 valid, 8 routable -> 8; sample 2: 5 valid, 5 routable -> skip 2
  EXPECT_EQ(k[0].item<int64_t>(), 8);
  EXPECT_EQ(k[1].item<int64_t>(), 5);
  EXPECT_EQ(k[2].item<int64_t>(), 3);
  auto paper = routing_masks(in.token_roles, in.attention_mask, 3, 12, ForcedKeep::kQuestions, at::kCPU);
  EXPECT_GT(paper.routable.sum().item<int64_t>(), m.routable.sum().item<int64_t>()) << "answers routable in paper mode";
  EXPECT_FALSE((m.routable & m.valid.logical_not()).any().item<bool>());
}

TEST(MoDLayer, SkippedTokensLeaveBitIdenticalAndCountsMatchCapacity) {
  auto model = test::random_text_lm(3, 7);
  convert_to_mod(*model, gamma_cfg({1, 2}, 0.5));
  auto in = test::text_inputs({14, 10, 7}, 14, 10, 2);
  auto st = layer_state(*model, in, at::kFloat);
  auto layer = mod_layers(*model)[0];
  layer->record_selection = true;
  auto h = at::randn({3, 14, 32});
  auto out = layer->forward(h, st, 1);
  ASSERT_EQ(layer->recorded.size(), 1u);
  auto sel = layer->recorded[0];
  auto skipped = sel.logical_not().unsqueeze(-1).expand_as(h);
  EXPECT_TRUE(at::equal(out.masked_select(skipped), h.masked_select(skipped)));
  EXPECT_FALSE(at::equal(out.masked_select(sel.unsqueeze(-1).expand_as(h)), h.masked_select(sel.unsqueeze(-1).expand_as(h))));
  auto expect_k = std::vector<int64_t>{14 - 5, 10 - 5, 7 - 3};  // routable 10, 10, 7 -> skip 5, 5, 3 (floor 3.5)
  for (int b = 0; b < 3; ++b) EXPECT_EQ(sel[b].sum().item<int64_t>(), expect_k[b]) << "sample " << b;
  // Forced (question/answer) tokens always processed, padding never.
  auto m = routing_masks(in.token_roles, in.attention_mask, 3, 14, ForcedKeep::kQuestionsAnswers, at::kCPU);
  EXPECT_TRUE(at::equal(sel & m.forced, m.forced));
  EXPECT_FALSE((sel & m.valid.logical_not()).any().item<bool>());
  ASSERT_EQ(st.tokens.size(), 1u);
  EXPECT_EQ(st.tokens[0].processed, 9 + 5 + 4);
  EXPECT_EQ(st.tokens[0].attn_pairs, 9 * 10 / 2 + 5 * 6 / 2 + 4 * 5 / 2);
  EXPECT_EQ(st.aux_losses.size(), 1u);
}

TEST(MoDLayer, FullCapacityWithoutRouterScalingEqualsDense) {
  auto in = test::fixture_inputs();
  auto dense = load_pretrained(test::llava_fixture());
  auto mod = load_pretrained(test::llava_fixture());
  auto cfg = gamma_cfg({0, 1}, 0.0);
  cfg.scale_by_router = false;
  convert_to_mod(*mod, cfg);
  at::NoGradGuard ng;
  auto ref = dense->forward(in).logits;
  for (bool training : {true, false}) {  // top-k (keeps all at skip 0) and thresholds (p > 0.005 for all)
    mod->train(training);
    ForwardState st;
    auto got = mod->forward(in, st).logits;
    EXPECT_LT(test::max_abs_valid(got, ref, in.attention_mask), 1e-5) << "training=" << training;
    for (const auto& t : st.tokens) EXPECT_EQ(t.processed, t.total);
  }
}

// With router scaling on, a zero router gives p = 0.5 exactly and halves the MLP delta of every token (γ-MoD
// scales only the MLP delta): out = a + 0.5 m, where a = h + attn (the dense layer with down_proj zeroed) and
// a + m is the dense layer's output.
TEST(MoDLayer, ZeroRouterWithScalingHalvesTheMlpDelta) {
  auto dense = test::random_text_lm(2, 21);
  auto mod = test::random_text_lm(2, 21);
  convert_to_mod(*mod, gamma_cfg({0, 1}, 0.0));
  at::NoGradGuard ng;
  shared_router(*mod)->weight.zero_();
  auto in = test::text_inputs({12, 9}, 12, 9, 5);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  auto h = at::randn({2, 12, 32}, gen);
  auto st = layer_state(*dense, in, at::kFloat);
  auto layer = std::dynamic_pointer_cast<DenseDecoderLayer>((*dense->llm->layers)[1]);
  ASSERT_TRUE(layer);
  auto full = layer->forward(h, st, 1);  // a + m
  layer->mlp->down_proj->weight.zero_();
  auto a = layer->forward(h, st, 1);  // a
  auto st2 = layer_state(*mod, in, at::kFloat);
  auto half = mod_layers(*mod)[1]->forward(h, st2, 1);
  EXPECT_GT(test::max_abs_valid(full, a, in.attention_mask), 1e-2)
      << "the MLP delta should not be negligible";
  EXPECT_LT(test::max_abs_valid(half, a + 0.5 * (full - a), in.attention_mask), 1e-5);
}

TEST(MoDLayer, RoutingLossGradientMatchesFiniteDifferences) {
  auto model = test::random_text_lm(2, 11, at::kDouble);
  auto cfg = gamma_cfg({1}, 0.5);
  cfg.router_aux_loss_coef = 1.0;
  convert_to_mod(*model, cfg);
  auto router = shared_router(*model);
  {
    at::NoGradGuard ng;
    router->weight.mul_(8.0);  // spread p so top-k has no near-ties
  }
  auto in = test::text_inputs({12, 9}, 12, 9, 5);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  auto R = at::randn({2, 12, 32}, gen, at::kDouble);
  auto h = at::randn({2, 12, 32}, gen, at::kDouble);
  auto layer = mod_layers(*model)[0];
  layer->record_selection = true;
  // The layer's own output: RMSNorm computes in fp32 (as transformers), so a norm downstream of the
  // router would limit finite differences to fp32 precision.
  auto objective = [&]() {
    auto st = layer_state(*model, in, at::kDouble);
    auto out = layer->forward(h, st, 1);
    auto f = (out * R * in.attention_mask.unsqueeze(-1)).sum();
    return f + total_routing_loss(st, cfg);
  };
  auto f0 = objective();
  f0.backward();
  auto grad = router->weight.grad().clone();
  auto sel0 = layer->recorded.back().clone();
  double max_err = 0, max_g = 0;
  at::NoGradGuard ng;
  auto w = router->weight;
  const double eps = 1e-6;
  for (int64_t i = 0; i < w.numel(); ++i) {
    auto flat = w.view({-1});
    const double orig = flat[i].item<double>();
    flat[i] = orig + eps;
    const double fp = objective().item<double>();
    EXPECT_TRUE(at::equal(layer->recorded.back(), sel0)) << "selection changed under perturbation";
    flat[i] = orig - eps;
    const double fm = objective().item<double>();
    flat[i] = orig;
    const double fd = (fp - fm) / (2 * eps);
    max_err = std::max(max_err, std::abs(fd - grad.view({-1})[i].item<double>()));
    max_g = std::max(max_g, std::abs(fd));
  }
  EXPECT_GT(max_g, 1e-3);
  EXPECT_LT(max_err, 1e-6 * std::max(1.0, max_g));
}

TEST(MoDLayer, RoutingLossAveragesOverValidPositions) {
  auto logits = at::tensor({0.0, 0.0, 1.0, -1.0, 3.0, 2.0}, at::kDouble).view({1, 3, 2});
  auto sel = (at::tensor({1, 0, 1}) > 0).view({1, 3});
  auto valid = (at::tensor({1, 1, 0}) > 0).view({1, 3});
  const double l0 = std::log(2.0), l1 = std::log(std::exp(1.0) + std::exp(-1.0)) - 1.0;
  EXPECT_NEAR(routing_loss(logits, sel, valid).item<double>(), (l0 + l1) / 2, 1e-12);
}

TEST(MoDLayer, PerLayerRouterTrainsAndPaperMaskRoutesAnswers) {
  auto model = test::random_text_lm(3, 4);
  MoDConfig cfg = gamma_cfg({1, 2}, 0.5);
  cfg.router = RouterKind::kPerLayer;
  cfg.forced_keep = ForcedKeep::kQuestions;
  convert_to_mod(*model, cfg);
  auto in = test::text_inputs({14, 12}, 14, 8, 3);
  ForwardState st;
  auto out = model->forward(in, st);
  ASSERT_EQ(st.aux_losses.size(), 2u);
  (out.logits.sum() + total_routing_loss(st, cfg)).backward();
  auto params = model->named_parameters();
  ASSERT_TRUE(params.contains("llm.layers.1.router.weight"));
  EXPECT_GT(params["llm.layers.1.router.weight"].grad().abs().sum().item<double>(), 0.0);
  // Paper mask: routable = 8 image/system + answers.
  auto m = routing_masks(in.token_roles, in.attention_mask, 2, 14, ForcedKeep::kQuestions, at::kCPU);
  auto k = topk_capacity(m, 0.5);
  EXPECT_EQ(st.tokens[1].processed, k.sum().item<int64_t>());
}

TEST(Accounting, FlopsFollowKeptTokens) {
  auto model = test::random_text_lm(4, 2);
  convert_to_mod(*model, gamma_cfg({1, 2, 3}, 0.5));
  auto in = test::text_inputs({16, 16}, 16, 12, 8);
  ForwardState st;
  model->forward(in, st);
  auto rep = account_compute(st.tokens, model->config.text, {16, 16});
  ASSERT_EQ(rep.layers.size(), 4u);
  EXPECT_FALSE(rep.layers[0].mod);
  EXPECT_DOUBLE_EQ(rep.layers[0].flops, rep.layers[0].dense_flops);
  // 12 routable per sample -> 6 skipped of 16 at each MoD layer.
  EXPECT_EQ(rep.layers[1].processed, 20);
  EXPECT_NEAR(rep.mod_skip_ratio(), 6.0 / 16, 1e-12);
  EXPECT_NEAR(rep.skip_ratio(), 3 * 12.0 / (4 * 32), 1e-12);
  const auto& c = model->config.text;
  const double expect_mod = 20 * token_linear_flops(c) + 2 * (10 * 11 / 2) * attention_pair_flops(c);
  EXPECT_NEAR(rep.layers[1].flops, expect_mod, 1e-6 * expect_mod);
  EXPECT_LT(rep.flop_ratio(), 1.0);
  EXPECT_NE(rep.table().find("skip ratio"), std::string::npos);
}

}  // namespace test_mod_layer

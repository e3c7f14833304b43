// The MoD layer's hot path: ragged kept counts through plain causal attention (no mask) equal the masked path and
// a per-sample run without any padding; host-side capacities equal the device ones; training MoD layers never
// synchronise with the host (counted with HostSyncCounter); A-MoD scores carry no autograd and an A-MoD training
// step peaks within 10% of the γ-MoD step's memory.
#include <gtest/gtest.h>

#include "mod/conversion.h"
#include "model/token_roles.h"
#include "mod/host_sync_counter.h"
#include "mod/pmod.h"
#include "tests/mod/mod_test_util.h"
#include "trainer/plan/memory_tracker.h"

using namespace gmod;

// A named namespace around the file keeps its helpers apart from other files in a unity build.
namespace test_mod_fused {
namespace {

ForwardState layer_state(MultimodalLM& m, const ModelInputs& in, at::ScalarType dt) {
  ForwardState st;
  prepare_forward_state(st, in.input_ids, in.attention_mask, in.positions);
  st.token_roles = in.token_roles;
  st.rope = &m.llm->rope;
  std::tie(st.cos, st.sin) = m.llm->rope.cos_sin(st.positions, dt);
  return st;
}

MoDConfig config(RouterKind kind, std::vector<int> layers) {
  MoDConfig c;
  c.router = kind;
  c.mod_layers = std::move(layers);
  return c;
}

double max_rel(const at::Tensor& a, const at::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item<double>();
}

}  // namespace

TEST(MoDFusedAttention, RaggedCausalOnlyEqualsMaskedPathAndPerSampleRuns) {
  auto model = test::random_text_lm(3, 7, at::kDouble);
  convert_to_mod(*model, config(RouterKind::kGammaShared, {1, 2}));
  model->train();
  auto in = test::text_inputs({14, 10, 7}, 14, 10, 2);  // kept 9, 5, 4: ragged
  auto layer = mod_layers(*model)[0];
  layer->record_selection = true;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  auto h = at::randn({3, 14, 32}, gen, at::kDouble);
  auto R = at::randn({3, 14, 32}, gen, at::kDouble);

  struct Run {
    at::Tensor out;
    std::vector<at::Tensor> grads;
  };
  auto run = [&](bool masked) {
    model->zero_grad();
    auto st = layer_state(*model, in, at::kDouble);
    st.want_attn_probs = masked;  // the analysis path attends with the explicit causal + key-padding mask
    auto out = layer->forward(h, st, 1);
    (out * R).sum().backward();
    Run r{out.detach(), {}};
    for (auto& p : model->parameters())
      if (p.grad().defined()) r.grads.push_back(p.grad().clone());
    return r;
  };
  const Run fused = run(false), masked = run(true);
  ASSERT_EQ(layer->recorded.size(), 2u);
  ASSERT_TRUE(at::equal(layer->recorded[0], layer->recorded[1]));
  const auto sel = layer->recorded[0];
  EXPECT_EQ(sel.sum(1).max().item<int64_t>(), 9);
  EXPECT_EQ(sel.sum(1).min().item<int64_t>(), 4);
  // The explicit masked path takes its softmax in fp32 (as transformers' eager path), hence 1e-6 here.
  EXPECT_LT(max_rel(fused.out, masked.out), 1e-6);
  ASSERT_EQ(fused.grads.size(), masked.grads.size());
  ASSERT_GE(fused.grads.size(), 8u);  // attention, MLP, norms and the shared router
  for (size_t i = 0; i < fused.grads.size(); ++i) EXPECT_LT(max_rel(fused.grads[i], masked.grads[i]), 1e-6) << i;
  {
    // SDPA with the boolean causal + key-padding mask (the previous hot path) against plain causal SDPA on the same
    // compacted rows, in double: equal on the real rows.
    auto c = compact(sel);
    auto n = layer->input_layernorm->forward(gather_tokens(h, c.index));
    auto [cos, sin] = model->llm->rope.cos_sin(at::arange(c.kmax, at::kLong).unsqueeze(0), at::kDouble);
    auto with_mask = layer->self_attn->forward(n, cos, sin, AttentionMask::causal(c.valid, c.kmax, c.kmax, 0));
    auto causal_only = layer->self_attn->forward(n, cos, sin, AttentionMask{});
    EXPECT_LT(test::max_abs_valid(causal_only, with_mask, c.valid), 1e-12 * with_mask.abs().max().item<double>());
  }

  // Each sample's kept tokens alone (no padding at all), through the same submodules: attention, MLP x p.
  at::NoGradGuard ng;
  auto router = shared_router(*model);
  for (int64_t b = 0; b < 3; ++b) {
    auto idx = sel[b].nonzero().squeeze(1);
    const int64_t k = idx.numel();
    auto x = h[b].index_select(0, idx).unsqueeze(0);  // [1, k, D]
    auto n = layer->input_layernorm->forward(x);
    auto [cos, sin] = model->llm->rope.cos_sin(at::arange(k, at::kLong).unsqueeze(0), at::kDouble);
    auto a = x + layer->self_attn->forward(n, cos, sin, AttentionMask{});
    auto p = at::softmax(router->logits(n), -1).select(-1, 1).unsqueeze(-1);
    auto y = a + p * layer->mlp->forward(layer->post_attention_layernorm->forward(a));
    EXPECT_LT(max_rel(fused.out[b].index_select(0, idx), y.squeeze(0)), 1e-12) << "sample " << b;
  }
}

TEST(MoDFusedAttention, HostCapacitiesEqualDeviceCapacities) {
  auto in = test::text_inputs({23, 17, 9, 1}, 23, 13, 6);
  const int64_t B = 4, L = 23;
  auto counts = count_routing_roles(in.token_roles, in.attention_mask, B, L);
  for (auto fk : {ForcedKeep::kQuestions, ForcedKeep::kQuestionsAnswers})
    for (bool all : {false, true})
      for (double s : {0.0, 0.3, 0.5, 0.875, 1.0}) {
        auto m = routing_masks(in.token_roles, in.attention_mask, B, L, fk, at::kCPU, all);
        auto dev = topk_capacity(m, s);
        auto host = host_capacity(counts, s, fk, all);
        for (int64_t b = 0; b < B; ++b) {
          EXPECT_EQ(host.k[b], dev[b].item<int64_t>()) << "s " << s << " all " << all << " sample " << b;
          EXPECT_EQ(host.routable[b], m.routable[b].sum().item<int64_t>());
          EXPECT_EQ(host.valid[b], m.valid[b].sum().item<int64_t>());
        }
        EXPECT_EQ(host.kmax, dev.max().item<int64_t>());
      }
  // p-MoD: routable = the image tokens; its float32 kept share on the host and on the device, over ratios whose
  // products with the image counts land on and next to integers.
  auto pm = routing_masks(in.token_roles, in.attention_mask, B, L, ForcedKeep::kQuestions, at::kCPU, false);
  pm.routable = pm.valid & (in.token_roles == static_cast<int64_t>(TokenRole::kImage));
  for (double r : {0.0, 0.15, 0.2, 1.0 / 3.0, 0.5, 0.7, 0.85, 0.999, 1.0}) {
    const auto dev = pmod_capacity(pm, r);
    const auto host = pmod_capacity(counts, r);
    for (int64_t b = 0; b < B; ++b) {
      EXPECT_EQ(host.k[b], dev[b].item<int64_t>()) << "ratio " << r << " sample " << b;
      EXPECT_EQ(host.routable[b], pm.routable[b].sum().item<int64_t>()) << "sample " << b;
    }
    EXPECT_EQ(host.kmax, dev.max().item<int64_t>()) << "ratio " << r;
  }
  // Without roles nothing is routable (γ-MoD) or every real token is (A-MoD as the paper defines it).
  auto bare = count_routing_roles(at::Tensor(), in.attention_mask, B, L);
  EXPECT_EQ(host_capacity(bare, 0.5, ForcedKeep::kQuestions, false).k[0], 23);
  EXPECT_EQ(host_capacity(bare, 0.5, ForcedKeep::kQuestions, true).k[0], 23 - 11);
}

TEST(MoDSyncs, TrainingModLayersNeverWaitForTheHost) {
  auto in = test::text_inputs({16, 11, 7}, 16, 10, 3);  // unequal lengths: ragged kept counts
  in.labels = in.input_ids.masked_fill(in.attention_mask.logical_not(), -100);
  in.host_role_counts = count_routing_roles(in.token_roles, in.attention_mask, 3, 16);  // as the data pipeline does
  auto step_syncs = [&](MultimodalLM& m) {
    HostSyncCounter counter;
    ForwardState st;
    auto out = m.forward(in, st);
    auto loss = out.lm_loss;
    for (auto& a : st.aux_losses) loss = loss + a;
    loss.backward();
    return counter.counts();
  };
  auto dense = test::random_text_lm(4, 3);
  dense->train();
  const auto base = step_syncs(*dense);
  for (auto kind : {RouterKind::kGammaShared, RouterKind::kPerLayer, RouterKind::kAttention, RouterKind::kPMoD}) {
    auto m = test::random_text_lm(4, 3);
    // p-MoD: its schedule's layers (1-3 of 4) and kept shares, capacities from the host counts' image column.
    convert_to_mod(*m, kind == RouterKind::kPMoD ? pmod_config(4) : config(kind, {1, 3}));
    m->train();
    const auto got = step_syncs(*m);
    EXPECT_EQ(got.total(), base.total()) << to_string(kind) << ": " << got.to_string() << " vs dense "
                                         << base.to_string();
    // The layers alone, with the roles counted on the host: zero.
    auto st = layer_state(*m, in, at::kFloat);
    st.host_role_counts = in.host_role_counts;
    st.routing_scores = at::rand({3, 16});
    auto h = at::randn({3, 16, 32});
    HostSyncCounter counter;
    auto out = (*m->llm->layers)[1]->forward(h, st, 1);
    out.sum().backward();
    EXPECT_EQ(counter.counts().total(), 0) << to_string(kind) << ": " << counter.counts().to_string();
    ASSERT_EQ(st.tokens.size(), 1u);
    EXPECT_LT(st.tokens[0].processed, st.tokens[0].total);
  }
  // The counter sees a MoD layer's syncs where they are data-dependent (thresholds at inference).
  auto m = test::random_text_lm(4, 3);
  convert_to_mod(*m, config(RouterKind::kGammaShared, {1, 3}));
  m->eval();
  at::NoGradGuard ng;
  auto st = layer_state(*m, in, at::kFloat);
  HostSyncCounter counter;
  (*m->llm->layers)[1]->forward(at::randn({3, 16, 32}), st, 1);
  EXPECT_GE(counter.counts().total(), 2) << counter.counts().to_string();
}

TEST(AModScores, ComputedWithoutAutogradAndFromTheKernelsLogSumExp) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(2);
  const int64_t B = 2, H = 4, Hkv = 2, L = 45, Dh = 8;
  auto q = (at::randn({B, H, L, Dh}, gen) * 2.0).requires_grad_(true);
  auto k = (at::randn({B, Hkv, L, Dh}, gen) * 2.0).requires_grad_(true);
  auto v = at::randn({B, Hkv, L, Dh}, gen);
  auto valid = at::ones({B, L}, at::kBool);
  valid[1].narrow(0, 31, 14).fill_(false);  // right padding
  auto s = attention_column_scores(q, k, valid, false, 16);
  EXPECT_FALSE(s.requires_grad());
  EXPECT_FALSE(s.grad_fn());
  // The CPU flash kernel's log-sum-exp (plain causal, padded rows included) gives the same scores in one pass.
  auto kr = k.detach().repeat_interleave(H / Hkv, 1), vr = v.repeat_interleave(H / Hkv, 1);
  auto lse = std::get<1>(at::_scaled_dot_product_flash_attention_for_cpu(q.detach(), kr, vr, 0.0, true));
  auto probs = explicit_attention(q.detach(), kr, vr, AttentionMask::causal(valid, L, L, 0).allowed, true,
                                  1.0 / std::sqrt(double(Dh)))
                   .second;
  for (bool cn : {false, true}) {
    auto ref = attention_column_scores_from_probs(probs, valid, cn);
    EXPECT_LT((attention_column_scores(q, k, valid, cn, 16, lse) - ref).abs().max().item<double>(), 1e-6) << cn;
    EXPECT_LT((attention_column_scores(q, k, valid, cn, 16) - ref).abs().max().item<double>(), 1e-6) << cn;
  }
  // In a model: the scores a scoring layer leaves need no grad, and the attention hands over its lse.
  auto model = test::random_text_lm(3, 5);
  convert_to_mod(*model, config(RouterKind::kAttention, {1}));
  model->train();
  auto in = test::text_inputs({12, 9}, 12, 6, 1);
  ForwardState st;
  model->forward(in, st);
  ASSERT_TRUE(st.routing_scores.defined());
  EXPECT_FALSE(st.routing_scores.requires_grad());
  auto side_model = test::random_text_lm(1, 5);
  auto& attn = *std::dynamic_pointer_cast<DenseDecoderLayer>((*side_model->llm->layers)[0])->self_attn;
  auto x = at::randn({2, 12, 32}, gen);
  auto [cos, sin] = side_model->llm->rope.cos_sin(at::arange(12, at::kLong).unsqueeze(0), at::kFloat);
  AttentionSide side;
  auto with_side = attn.forward(x, cos, sin, AttentionMask{}, nullptr, nullptr, &side);
  EXPECT_TRUE(at::equal(with_side, attn.forward(x, cos, sin, AttentionMask{}))) << "same kernel as SDPA";
  ASSERT_TRUE(side.lse.defined());
  EXPECT_EQ(side.lse.sizes(), (std::vector<int64_t>{2, 4, 12}));
}

TEST(AModMemory, TrainingStepPeakWithinTenPercentOfGammaMoD) {
  auto& tracker = MemoryTracker::install();
  const int64_t L = 192;
  // Every token image-role, so γ-MoD (routable image/system) and A-MoD (all routable) keep the same counts.
  auto in = test::text_inputs({L, L}, L, L, 8);
  in.labels = in.input_ids.clone();
  in.host_role_counts = count_routing_roles(in.token_roles, in.attention_mask, 2, L);
  auto peak = [&](RouterKind kind) {
    auto m = test::random_text_lm(4, 9);
    convert_to_mod(*m, config(kind, {1, 3}));
    m->train();
    tracker.reset_peak();
    const int64_t base = tracker.live_bytes();
    ForwardState st;
    auto out = m->forward(in, st);
    auto loss = out.lm_loss;
    for (auto& a : st.aux_losses) loss = loss + a;
    loss.backward();
    EXPECT_EQ(st.tokens[1].processed, 2 * (L - L / 2)) << to_string(kind);
    return double(tracker.peak_bytes() - base);
  };
  const double gamma = peak(RouterKind::kGammaShared), amod = peak(RouterKind::kAttention);
  EXPECT_GT(gamma, 0.0);
  EXPECT_LT(std::abs(amod - gamma), 0.1 * gamma) << "A-MoD peak " << amod << " B, γ-MoD peak " << gamma << " B";
}

}  // namespace test_mod_fused

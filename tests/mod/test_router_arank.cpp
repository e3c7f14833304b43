// A-MoD fused column scores against the explicit map; ARank of constructed maps; conversion rules
// picking low-rank layers; conversion surgery (names, shared router once); MoDConfig JSON.
#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>

#include "mod/arank.h"
#include "mod/conversion.h"
#include "tests/mod/mod_test_util.h"

using namespace gmod;

TEST(AModScores, TiledColumnScoresEqualExplicitAttention) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const int64_t B = 2, H = 4, Hkv = 2, L = 37, Dh = 8;
  auto q = at::randn({B, H, L, Dh}, gen) * 2.0;
  auto k = at::randn({B, Hkv, L, Dh}, gen) * 2.0;
  auto v = at::randn({B, H, L, Dh}, gen);
  auto valid = at::ones({B, L}, at::kBool);
  valid[1].narrow(0, 29, 8).fill_(false);
  auto mask = AttentionMask::causal(valid, L, L, 0);
  auto probs = explicit_attention(q, k.repeat_interleave(H / Hkv, 1), v, mask.allowed, true, 1.0 / std::sqrt(8.0)).second;
  for (bool cn : {true, false}) {
    auto ref = attention_column_scores_from_probs(probs, valid, cn);
    for (int64_t tile : {8, 16, 64}) {
      auto got = attention_column_scores(q, k, valid, cn, tile);
      EXPECT_LT((got - ref).abs().max().item<double>(), 1e-6) << "tile " << tile << " causal_normalise " << cn;
    }
  }
  // Column sums of a causal map add up to the number of valid queries (per head).
  auto s = attention_column_scores(q, k, valid, false, 16);
  EXPECT_NEAR(s[1].sum().item<double>(), 1.0, 1e-5);
}

TEST(AModScores, AttentionRoutedModelTrainsAndReportsCapacity) {
  // Paper defaults: interleaved MoD layers, every real token routable at capacity C = 1 - skip_frac, 1/N scores.
  auto model = test::random_text_lm(4, 5);
  auto dense_names = model->named_parameters().keys();
  MoDConfig cfg;
  cfg.router = RouterKind::kAttention;
  cfg.mod_layers = {1, 3};
  EXPECT_FALSE(cfg.amod_causal_normalise);
  convert_to_mod(*model, cfg);
  EXPECT_EQ(model->named_parameters().keys(), dense_names);
  EXPECT_TRUE(std::dynamic_pointer_cast<AttentionScoringLayer>((*model->llm->layers)[0]) != nullptr);
  EXPECT_TRUE(std::dynamic_pointer_cast<AttentionScoringLayer>((*model->llm->layers)[2]) != nullptr);
  auto in = test::text_inputs({16, 12}, 16, 10, 4);
  ForwardState st;
  auto out = model->forward(in, st);
  EXPECT_TRUE(st.aux_losses.empty());
  out.logits.sum().backward();
  ASSERT_EQ(st.tokens.size(), 4u);
  for (int l : {1, 3}) {
    EXPECT_EQ(st.tokens[l].processed, (16 - 8) + (12 - 6)) << "layer " << l;  // ceil(0.5 n) of all n tokens
    EXPECT_EQ(st.tokens[l].routable, 16 + 12) << "layer " << l;
  }
  // Consecutive A-MoD layers have no full map to route by: an error unless an adaptation is chosen.
  MoDConfig consecutive = cfg;
  consecutive.mod_layers = {1, 2, 3};
  try {
    convert_to_mod(*test::random_text_lm(4, 1), consecutive);
    ADD_FAILURE() << "consecutive A-MoD layers accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("layers 1 and 2 are consecutive"), std::string::npos) << e.what();
  }
  // The adaptation (previous behaviour): causal normalisation, image/system routable only, carried scores.
  auto adapted_model = test::random_text_lm(4, 5);
  MoDConfig adapted = consecutive;
  adapted.amod_causal_normalise = true;
  adapted.amod_routable = AmodRoutable::kRoles;
  adapted.amod_skipped = AmodSkippedScore::kCarry;
  convert_to_mod(*adapted_model, adapted);
  ForwardState st2;
  adapted_model->forward(in, st2).logits.sum().backward();
  for (int l = 1; l < 4; ++l) EXPECT_EQ(st2.tokens[l].processed, (16 - 5) + (12 - 5)) << "layer " << l;
  MoDConfig bad = cfg;
  bad.mod_layers = {0, 1};
  EXPECT_THROW(convert_to_mod(*test::random_text_lm(2, 1), bad), std::invalid_argument);
}

namespace {
// Causal maps [H, n, n]: "sink" rows put half on token 0 and half on themselves (rank 1 once the
// diagonal is zeroed); "uniform" rows spread evenly (rank n - 1).
at::Tensor sink_map(int64_t n) {
  auto a = at::zeros({n, n});
  a[0][0] = 1.0;
  for (int64_t i = 1; i < n; ++i) {
    a[i][0] = 0.5;
    a[i][i] = 0.5;
  }
  return a;
}
at::Tensor uniform_map(int64_t n) {
  auto a = at::ones({n, n}).tril();
  return a / a.sum(-1, true);
}
}  // namespace

TEST(ARank, ConstructedMapsHaveKnownRank) {
  const int64_t n = 24;
  EXPECT_DOUBLE_EQ(attention_rank(sink_map(n).unsqueeze(0)), 1.0);
  EXPECT_DOUBLE_EQ(attention_rank(uniform_map(n).unsqueeze(0)), n - 1.0);
  EXPECT_DOUBLE_EQ(attention_rank(at::stack({sink_map(n), uniform_map(n)})), n / 2.0);
  // Rank r: rows mix the first r tokens with fixed patterns.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(2);
  auto basis = at::rand({3, n}, gen);
  basis.narrow(1, 3, n - 3).zero_();
  auto mixed = at::rand({n, 3}, gen).matmul(basis);  // rank 3, zero outside the first 3 columns
  mixed = mixed.tril(-1);                            // no diagonal, keeps rank 3 from row 3 on
  EXPECT_DOUBLE_EQ(attention_rank(mixed.unsqueeze(0)), 3.0);
}

TEST(Conversion, RulesPickLowRankLayers) {
  const int64_t n = 20;
  // Six layers: full, full, low, low, low, full (as ARank computes them from maps).
  std::vector<bool> low = {false, false, true, true, true, false};
  ARankAccumulator acc(6);
  for (int s = 0; s < 3; ++s)
    for (int l = 0; l < 6; ++l) acc.add(l, attention_rank((low[l] ? sink_map(n) : uniform_map(n)).unsqueeze(0)));
  auto ar = acc.result();
  EXPECT_EQ(ar.samples, 3);
  EXPECT_DOUBLE_EQ(ar.layers[2].mean, 1.0);
  EXPECT_DOUBLE_EQ(ar.layers[0].std, 0.0);
  const std::vector<int> expect = {2, 3, 4};
  EXPECT_EQ(select_mod_layers(parse_conversion_rule("keep_top:3"), 6, ar.means()), expect);
  EXPECT_EQ(select_mod_layers(parse_conversion_rule("threshold:10"), 6, ar.means()), expect);
  EXPECT_EQ(select_mod_layers(parse_conversion_rule("arank_mod"), 6), (std::vector<int>{3, 4}));
  EXPECT_EQ(select_mod_layers(parse_conversion_rule("arank_mod"), 32).size(), 28u);
  EXPECT_EQ(select_mod_layers(parse_conversion_rule("layers:5,1,3"), 6), (std::vector<int>{1, 3, 5}));
  EXPECT_THROW(select_mod_layers(parse_conversion_rule("keep_top:3"), 6), std::invalid_argument);
  EXPECT_THROW(parse_conversion_rule("threshold:abc"), std::invalid_argument);
  EXPECT_THROW(select_mod_layers(parse_conversion_rule("layers:7"), 6), std::invalid_argument);
  auto j = ar.to_json();
  EXPECT_EQ(j["layers"].size(), 6u);
  EXPECT_NE(ar.table().find("#"), std::string::npos);
}

TEST(ARank, ModelWithUniformAttentionLayerHasRankNMinusOne) {
  auto model = load_pretrained(test::llava_fixture());
  {
    at::NoGradGuard ng;
    auto dense = std::dynamic_pointer_cast<DenseDecoderLayer>((*model->llm->layers)[0]);
    dense->self_attn->q_proj->weight.zero_();  // scores 0 -> uniform causal attention in layer 0
  }
  auto in = test::fixture_inputs();
  auto r = compute_arank(*model, {in});
  ASSERT_EQ(r.layers.size(), 2u);
  EXPECT_EQ(r.samples, 3);
  const double expect = (25 - 1 + 37 - 1 + 21 - 1) / 3.0;  // valid lengths 25, 37, 21
  EXPECT_NEAR(r.layers[0].mean, expect, 1e-9);
  // Layer 1 from an independent path: the attention maps of the model's own forward (not compute_arank's
  // unrolled one), each head's map restricted to real tokens, tril with a zero diagonal (γ-MoD's definition),
  // rank counted as singular values above max(sv) * n * FLT_EPSILON (torch.linalg.matrix_rank's default
  // tolerance).
  {
    at::NoGradGuard ng;
    ForwardState st;
    st.want_attn_probs = true;
    model->forward(in, st);
    ASSERT_EQ(st.attn_probs.size(), 2u);
    double sum = 0;
    for (int64_t b = 0; b < 3; ++b) {
      auto idx = in.attention_mask[b].to(at::kBool).nonzero().squeeze(1);
      auto p = st.attn_probs[1][b].index_select(1, idx).index_select(2, idx).tril(-1);  // [H, n, n]
      for (int64_t hd = 0; hd < p.size(0); ++hd) {
        auto sv = at::linalg_svdvals(p[hd]);
        const double tol =
            sv.max().item<double>() * double(p.size(1)) * std::numeric_limits<float>::epsilon();
        sum += (sv > tol).sum().item<double>() / double(p.size(0));
      }
    }
    EXPECT_NEAR(r.layers[1].mean, sum / 3.0, 1e-9);
  }
  ARankOptions first_two;
  first_two.max_samples = 2;
  auto r1 = compute_arank(*model, {in}, first_two);
  EXPECT_EQ(r1.samples, 2);
  test::TempDir tmp;
  write_arank_json(r, tmp.str("arank.json"));
  EXPECT_TRUE(std::filesystem::exists(tmp.str("arank.json")));
}

TEST(Conversion, KeepsParameterNamesAndRegistersSharedRouterOnce) {
  auto model = load_pretrained(test::llava_fixture());
  auto before = model->named_parameters();
  auto q1 = before["llm.layers.1.self_attn.q_proj.weight"];
  MoDConfig cfg;
  cfg.mod_layers = {0, 1};
  convert_to_mod(*model, cfg);
  auto after = model->named_parameters();
  EXPECT_EQ(after.size(), before.size() + 1);
  for (const auto& p : before) ASSERT_TRUE(after.contains(p.key())) << p.key();
  ASSERT_TRUE(after.contains("mod_router.weight"));
  EXPECT_EQ(after["mod_router.weight"].sizes(), (std::vector<int64_t>{2, 64}));
  int count = 0;
  for (const auto& t : model->parameters()) count += t.is_same(after["mod_router.weight"]);
  EXPECT_EQ(count, 1);
  EXPECT_TRUE(after["llm.layers.1.self_attn.q_proj.weight"].is_same(q1)) << "dense tensors reused";
  EXPECT_EQ(mod_layers(*model).size(), 2u);
  EXPECT_THROW(convert_to_mod(*model, cfg), std::logic_error);
  // Per-layer routers live in their layers.
  auto m2 = load_pretrained(test::llava_fixture());
  cfg.router = RouterKind::kPerLayer;
  cfg.mod_layers = {1};
  convert_to_mod(*m2, cfg);
  auto n2 = m2->named_parameters();
  EXPECT_TRUE(n2.contains("llm.layers.1.router.weight"));
  EXPECT_FALSE(n2.contains("mod_router.weight"));
}

TEST(MoDConfigJson, RoundTripsAndRejectsBadValues) {
  MoDConfig c;
  c.mod_layers = {3, 4, 5};
  c.router = RouterKind::kPerLayer;
  c.skip_frac = 0.34;
  c.forced_keep = ForcedKeep::kQuestions;
  c.rope_positions = RopePositions::kOriginal;
  c.decode_skip = false;
  c.selection = "keep_top:4";
  auto j = to_json(c);
  auto back = mod_config_from_json(nlohmann::json::parse(j.dump()));
  EXPECT_EQ(to_json(back), j);
  EXPECT_EQ(back.mod_layers, c.mod_layers);
  EXPECT_EQ(back.forced_keep, ForcedKeep::kQuestions);
  auto d = mod_config_from_json(nlohmann::json::object());
  EXPECT_EQ(d.router, RouterKind::kGammaShared);
  EXPECT_DOUBLE_EQ(d.router_aux_loss_coef, 0.01);
  EXPECT_DOUBLE_EQ(d.infer_threshold, 0.005);
  EXPECT_DOUBLE_EQ(d.decode_threshold, 0.5);
  EXPECT_THROW(mod_config_from_json(nlohmann::json{{"router", "mlp"}}), std::invalid_argument);
  EXPECT_THROW(mod_config_from_json(nlohmann::json{{"skip_fraction", 0.5}}), std::invalid_argument);
  EXPECT_THROW(mod_config_from_json(nlohmann::json{{"skip_frac", "half"}}), std::invalid_argument);
  c.skip_frac = 1.5;
  c.mod_layers = {4, 3};
  try {
    validate(c, 4, "cfg.json");
    FAIL();
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cfg.json"), std::string::npos);
    EXPECT_NE(m.find("skip_frac"), std::string::npos);
    EXPECT_NE(m.find("outside"), std::string::npos);
  }
}

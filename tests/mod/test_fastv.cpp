// FastV (mod/fastv.h) against FastV's own code (tests/fixtures/make_fastv_fixture.py runs its transformers
// fork at random weights): prefill logits of the kept rows and the kept positions, greedy generation with
// FastV's static KV-cache pruning (use_cache) and with its per-step re-pruning (recompute), plus the cache
// against a full recompute with the same decisions, batching, and the config's round trip through a model
// dir.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "mod/conversion.h"
#include "mod/fastv.h"
#include "mod/generate.h"
#include "mod/mod_checkpoint.h"
#include "tests/mod/mod_test_util.h"

using namespace gmod;

namespace {

std::string dir() { return test::fixture("fastv/model"); }

struct Case {
  std::string name;
  int k;
  double r;
};
const std::vector<Case> kCases = {{"k2_r50", 2, 0.5}, {"k1_r75", 1, 0.75}, {"k3_half_even", 3, 0.46875}};

SafetensorsFile& ref() {
  static SafetensorsFile f(test::fixture("fastv/reference.safetensors"));
  return f;
}

// Roles of an expanded FastV prompt: system before the image, image, question after it.
at::Tensor roles_of(const at::Tensor& ids, int64_t image_id) {
  auto roles = at::full(ids.sizes(), static_cast<int64_t>(TokenRole::kQuestion), at::kChar);
  const int64_t first = (ids[0] == image_id).to(at::kLong).argmax().item<int64_t>();
  roles.narrow(1, 0, first).fill_(static_cast<int64_t>(TokenRole::kSystem));
  roles.masked_fill_(ids == image_id, static_cast<int64_t>(TokenRole::kImage));
  return roles;
}

ModelInputs case_inputs(const std::string& c, int64_t image_id) {
  ModelInputs in;
  in.input_ids = ref().tensor(c + ".input_ids").clone();
  in.pixel_values = ref().tensor(c + ".pixel_values").clone();
  in.token_roles = roles_of(in.input_ids, image_id);
  return in;
}

std::shared_ptr<MultimodalLM> fastv_model(int k, double r) {
  auto m = load_pretrained(dir());
  convert_to_mod(*m, fastv_config(k, r, m->config.text.num_hidden_layers));
  m->eval();
  return m;
}

GenerateOptions greedy(bool cache, int64_t n) {
  GenerateOptions o;
  o.max_new_tokens = n;
  o.eos_token_id = -1;
  o.use_cache = cache;
  o.keep_logits = true;
  return o;
}

}  // namespace

TEST(FastV, KeptCountRoundsHalfToEvenAsPython) {
  EXPECT_EQ(fastv_kept_count(576, 0.5), 288);
  EXPECT_EQ(fastv_kept_count(16, 0.46875), 8);   // 8.5 -> 8
  EXPECT_EQ(fastv_kept_count(16, 0.40625), 10);  // 9.5 -> 10
  EXPECT_EQ(fastv_kept_count(576, 0.75), 144);
  EXPECT_EQ(fastv_kept_count(7, 1.0), 0);
  EXPECT_EQ(fastv_kept_count(7, 0.0), 7);
}

TEST(FastV, PrefillMatchesFastVCode) {
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.name);
    auto m = fastv_model(c.k, c.r);
    auto in = case_inputs(c.name, m->config.image_token_id);
    auto layers = mod_layers(*m);
    ASSERT_EQ(layers.size(), static_cast<size_t>(m->config.text.num_hidden_layers - c.k));
    for (auto& l : layers) l->record_selection = true;
    at::NoGradGuard ng;
    auto logits = m->forward(in).logits[0];  // [L, V]
    auto keep = ref().tensor(c.name + ".keep");
    // The kept positions: every FastV layer processes exactly FastV's keep_indexs.
    for (auto& l : layers) {
      ASSERT_EQ(l->recorded.size(), 1u);
      EXPECT_TRUE(at::equal(l->recorded[0][0].nonzero().squeeze(1), keep));
    }
    const auto expected = ref().tensor(c.name + ".prefill_logits");
    EXPECT_LT((logits.index_select(0, keep) - expected).abs().max().item<double>(), 1e-4);
  }
}

TEST(FastV, GreedyGenerationMatchesFastVCodeWithAndWithoutCache) {
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.name);
    auto m = fastv_model(c.k, c.r);
    auto in = case_inputs(c.name, m->config.image_token_id);
    for (bool cache : {true, false}) {
      SCOPED_TRACE(cache ? "cache (static pruning)" : "recompute (re-pruning each step)");
      const std::string tag = cache ? "cache" : "nocache";
      auto want_tokens = ref().tensor(c.name + ".tokens_" + tag);
      auto want_scores = ref().tensor(c.name + ".scores_" + tag);
      auto res = generate(*m, in, greedy(cache, want_tokens.size(0)));
      EXPECT_TRUE(at::equal(res.tokens[0], want_tokens)) << res.tokens << want_tokens;
      ASSERT_EQ(res.step_logits.size(), static_cast<size_t>(want_scores.size(0)));
      for (size_t t = 0; t < res.step_logits.size(); ++t)
        EXPECT_LT((res.step_logits[t][0] - want_scores[t]).abs().max().item<double>(), 1e-4) << "step " << t;
      // Only image tokens are skipped, only in layers >= K, and decode tokens always go through.
      const int64_t n_img = (in.token_roles == static_cast<int64_t>(TokenRole::kImage)).sum().item<int64_t>();
      const int64_t dropped = n_img - fastv_kept_count(n_img, c.r);
      const int64_t forwards =
          cache ? 1 : want_tokens.size(0);  // that pruned: the prefill, or every recompute
      for (const auto& l : res.compute.layers)
        EXPECT_EQ(l.total - l.processed, l.layer >= c.k ? dropped * forwards : 0) << "layer " << l.layer;
      EXPECT_LT(res.compute.decoder_flops, res.compute.decoder_dense_flops);
    }
  }
}

TEST(FastV, CachedDecodeEqualsRecomputeWithTheSameKeptTokens) {
  const auto& c = kCases[0];
  auto m = fastv_model(c.k, c.r);
  auto in = case_inputs(c.name, m->config.image_token_id);
  auto layers = mod_layers(*m);
  for (auto& l : layers) l->record_selection = true;
  const int64_t T = 6;
  auto cached = generate(*m, in, greedy(true, T));
  const int64_t L = in.input_ids.size(1);
  for (auto& l : layers) {
    ASSERT_EQ(static_cast<int64_t>(l->recorded.size()), T);
    l->forced_selection = at::cat(l->recorded, 1);  // prefill's kept set, then every fed generated token
    l->record_selection = false;
  }
  ModelInputs full = in;
  auto fed = cached.tokens.narrow(1, 0, T - 1);
  full.input_ids = at::cat({in.input_ids, fed}, 1);
  full.positions = at::arange(L + T - 1).unsqueeze(0);
  full.token_roles =
      at::cat({in.token_roles, at::full({1, T - 1}, static_cast<int64_t>(TokenRole::kAnswer), at::kChar)}, 1);
  at::NoGradGuard ng;
  auto logits = m->forward(full).logits[0];
  for (int64_t t = 0; t < T; ++t)
    EXPECT_LT((cached.step_logits[t][0] - logits[L - 1 + t]).abs().max().item<double>(), 1e-4)
        << "step " << t;
}

TEST(FastV, BatchedEqualsOneAtATime) {
  auto m = fastv_model(2, 0.5);
  const int64_t img = m->config.image_token_id;
  auto a = case_inputs("k2_r50", img), b = case_inputs("k1_r75", img);
  const int64_t La = a.input_ids.size(1), Lb = b.input_ids.size(1), L = std::max(La, Lb);
  auto pad = [&](const at::Tensor& t, int64_t n, int64_t v) {
    return at::cat({t, at::full({1, L - n}, v, t.options())}, 1);
  };
  ModelInputs batch;
  batch.input_ids = at::cat({pad(a.input_ids, La, 0), pad(b.input_ids, Lb, 0)}, 0);
  batch.attention_mask =
      at::cat({pad(at::ones({1, La}, at::kBool), La, 0), pad(at::ones({1, Lb}, at::kBool), Lb, 0)}, 0);
  batch.token_roles = at::cat({pad(a.token_roles, La, 0), pad(b.token_roles, Lb, 0)}, 0);
  batch.pixel_values = at::cat({a.pixel_values, b.pixel_values}, 0);
  auto both = generate(*m, batch, greedy(true, 4));
  auto one_a = generate(*m, a, greedy(true, 4)), one_b = generate(*m, b, greedy(true, 4));
  EXPECT_TRUE(at::equal(both.tokens[0], one_a.tokens[0]));
  EXPECT_TRUE(at::equal(both.tokens[1], one_b.tokens[0]));
  for (size_t t = 0; t < both.step_logits.size(); ++t) {
    EXPECT_LT((both.step_logits[t][0] - one_a.step_logits[t][0]).abs().max().item<double>(), 1e-4);
    EXPECT_LT((both.step_logits[t][1] - one_b.step_logits[t][0]).abs().max().item<double>(), 1e-4);
  }
}

TEST(FastV, ConfigRoundTripsThroughAModelDir) {
  auto m = fastv_model(2, 0.5);
  const auto cfg = mod_layers(*m).front()->cfg;
  test::TempDir tmp;
  const auto out = (tmp.path / "fastv").string();
  save_mod_pretrained(*m, cfg, out);
  auto rc = read_mod_config(out);
  ASSERT_TRUE(rc.has_value());
  EXPECT_EQ(rc->router, RouterKind::kFastV);
  EXPECT_EQ(rc->fastv_k, 2);
  EXPECT_EQ(rc->fastv_r, 0.5);
  EXPECT_EQ(rc->mod_layers, (std::vector<int>{2, 3}));
  EXPECT_EQ(to_json(*rc), to_json(cfg));
  auto back = load_mod_pretrained(out);
  back->eval();
  auto in = case_inputs("k2_r50", m->config.image_token_id);
  at::NoGradGuard ng;
  EXPECT_TRUE(at::equal(back->forward(in).logits, m->forward(in).logits));
  EXPECT_TRUE(std::dynamic_pointer_cast<FastVScoringLayer>((*back->llm->layers)[1]) != nullptr);
}

TEST(FastV, BadConfigsAreNamed) {
  auto expect_error = [](const nlohmann::json& j, const std::string& what) {
    try {
      validate(mod_config_from_json(j, "cfg.json"), 4, "cfg.json");
      ADD_FAILURE() << "accepted " << j.dump();
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("cfg.json"), std::string::npos) << e.what();
    }
  };
  nlohmann::json ok = {{"router", "fastv"},
                       {"fastv_k", 2},
                       {"fastv_r", 0.5},
                       {"mod_layers_idx", {2, 3}},
                       {"rope_positions", "original"}};
  EXPECT_NO_THROW(validate(mod_config_from_json(ok), 4));
  auto with = [&](const char* k, nlohmann::json v) {
    auto j = ok;
    j[k] = v;
    return j;
  };
  expect_error(with("fastv_k", 0), "fastv_k = 0");
  expect_error(with("fastv_k", 4), "fastv_k = 4");
  expect_error(with("fastv_r", 1.5), "fastv_r = 1.5");
  expect_error(with("fastv_r", -0.1), "fastv_r = -0.1");
  expect_error(with("mod_layers_idx", {3}), "every layer from fastv_k = 2 to 3");
  expect_error(with("rope_positions", "compacted"), "rope_positions must be \"original\"");
  expect_error(with("fastv_k", "two"), "bad MoD config value");
  expect_error(with("adaptive_threshold", "seqlen"), "router fastv has none");
  EXPECT_THROW(parse_fastv("2", 4), std::invalid_argument);
  EXPECT_THROW(parse_fastv("2:x", 4), std::invalid_argument);
  EXPECT_THROW(parse_fastv("0:0.5", 4), std::invalid_argument);
}

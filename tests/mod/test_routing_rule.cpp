// Adaptive inference thresholds (mod/routing_rule.h) and Direct γ-MoD (the attention rule on a dense model):
// the adaptive selections equal static-threshold runs whose thresholds the test computes from the rebuttal's
// formulas, cached decode equals a recompute with the same decisions, and the configs round-trip and fail by
// name.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "data/arank_samples.h"
#include "data/demo_dataset.h"
#include "mod/conversion.h"
#include "mod/generate.h"
#include "mod/mod_checkpoint.h"
#include "mod/routing_rule.h"
#include "tests/mod/decode_replay.h"
#include "tests/mod/mod_test_util.h"

using namespace gmod;

namespace {

constexpr auto prompt = &test::fixture_prompt;

// γ-MoD on layers 1-3 of a random 4-layer LLaVA, router probabilities spread around 0.5.
std::shared_ptr<MultimodalLM> gamma_model(double threshold) {
  auto model = test::random_llava(4, 3);
  MoDConfig cfg;
  cfg.mod_layers = {1, 2, 3};
  cfg.infer_threshold = threshold;
  convert_to_mod(*model, cfg);
  {
    at::NoGradGuard ng;
    shared_router(*model)->weight.mul_(40.0);
  }
  model->eval();
  return model;
}

struct Run {
  at::Tensor logits;
  std::vector<at::Tensor> sel;  // per MoD layer [B, L]
};
Run run(MultimodalLM& m, const ModelInputs& in) {
  auto layers = mod_layers(m);
  for (auto& l : layers) {
    l->recorded.clear();
    l->record_selection = true;
  }
  at::NoGradGuard ng;
  Run r;
  r.logits = m.forward(in).logits;
  for (auto& l : layers) {
    r.sel.push_back(l->recorded.at(0));
    l->record_selection = false;
  }
  return r;
}

}  // namespace

TEST(AdaptiveThreshold, FactorsAreTheRebuttalFormulas) {
  MoDConfig c;
  c.mod_layers = {1, 2, 3};
  auto n = at::tensor({100, 271, 50}, at::kLong);
  EXPECT_TRUE(at::equal(threshold_factor(c, 1, n), at::ones({3}, at::kDouble)));
  c.adaptive_threshold = AdaptiveThreshold::kSeqLen;
  c.avg_seqlen = 100.0;
  auto f = threshold_factor(c, 2, n);
  EXPECT_DOUBLE_EQ(f[0].item<double>(), 1.0);
  EXPECT_NEAR(f[1].item<double>(), 1.0 + std::log(2.71), 1e-12);
  EXPECT_NEAR(f[2].item<double>(), 1.0 - std::log(2.0), 1e-12);
  c.adaptive_threshold = AdaptiveThreshold::kARank;
  c.layer_arank = {10.0, 20.0, 30.0};  // mean 20
  EXPECT_NEAR(threshold_factor(c, 1, n)[0].item<double>(), 1.0 + std::log(0.5), 1e-12);
  EXPECT_NEAR(threshold_factor(c, 2, n)[1].item<double>(), 1.0, 1e-12);
  EXPECT_NEAR(routing_thresholds(c, 3, 0.005, n)[2].item<double>(), 0.005 * (1.0 + std::log(1.5)), 1e-15);
  EXPECT_THROW(threshold_factor(c, 0, n), std::invalid_argument);  // not a MoD layer
}

TEST(AdaptiveThreshold, SeqLenSelectsAsStaticThresholdsOfEachSample) {
  const double base = 0.5;
  auto model = gamma_model(base);
  auto in = prompt();
  const int64_t B = in.input_ids.size(0);
  auto lengths = in.attention_mask.sum(1);
  const double avg = lengths.to(at::kDouble).mean().item<double>();
  for (auto& l : mod_layers(*model)) {
    l->cfg.adaptive_threshold = AdaptiveThreshold::kSeqLen;
    l->cfg.avg_seqlen = avg;
  }
  auto adaptive = run(*model, in);
  for (auto& l : mod_layers(*model)) l->cfg.adaptive_threshold = AdaptiveThreshold::kNone;
  auto flat = run(*model, in);
  int64_t differs = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = lengths[b].item<int64_t>();
    const double thr = base * (1.0 + std::log(static_cast<double>(n) / avg));
    for (auto& l : mod_layers(*model)) l->cfg.infer_threshold = thr;
    auto one = run(*model, in);  // the whole batch at sample b's threshold; row b is the one that must agree
    auto valid = in.attention_mask[b];
    for (size_t i = 0; i < one.sel.size(); ++i) {
      EXPECT_TRUE(at::equal(adaptive.sel[i][b].masked_select(valid), one.sel[i][b].masked_select(valid)))
          << "sample " << b << " MoD layer " << i;
      differs += (flat.sel[i][b] != adaptive.sel[i][b]).logical_and(valid).sum().item<int64_t>();
    }
    EXPECT_LT(test::max_abs_valid(adaptive.logits.narrow(0, b, 1), one.logits.narrow(0, b, 1),
                                  in.attention_mask.narrow(0, b, 1)),
              1e-5);
  }
  EXPECT_GT(differs, 0) << "the adaptive thresholds changed nothing: the test cannot tell them apart";
}

TEST(AdaptiveThreshold, ARankSelectsAsPerLayerStaticThresholds) {
  const double base = 0.5;
  auto model = gamma_model(base);
  auto in = prompt();
  const std::vector<double> arank = {12.0, 30.0, 18.0};  // mean 20
  for (auto& l : mod_layers(*model)) {
    l->cfg.adaptive_threshold = AdaptiveThreshold::kARank;
    l->cfg.layer_arank = arank;
  }
  auto adaptive = run(*model, in);
  auto layers = mod_layers(*model);
  for (size_t i = 0; i < layers.size(); ++i) {
    layers[i]->cfg.adaptive_threshold = AdaptiveThreshold::kNone;
    layers[i]->cfg.infer_threshold = base * (1.0 + std::log(arank[i] / 20.0));
  }
  auto fixed = run(*model, in);
  for (size_t i = 0; i < layers.size(); ++i)
    EXPECT_TRUE(at::equal(adaptive.sel[i], fixed.sel[i])) << "layer " << i;
  EXPECT_LT((adaptive.logits - fixed.logits).abs().max().item<double>(), 1e-6);
}

TEST(AdaptiveThreshold, CachedDecodeEqualsRecomputationWithSameDecisions) {
  auto model = gamma_model(0.5);
  auto in = prompt();
  for (auto& l : mod_layers(*model)) {
    l->cfg.adaptive_threshold = AdaptiveThreshold::kSeqLen;
    l->cfg.avg_seqlen = 20.0;
    l->record_selection = true;
  }
  GenerateOptions o;
  o.max_new_tokens = 6;
  o.eos_token_id = -1;
  EXPECT_GT(test::expect_replay_equal(*model, in, o).skipped_decode, 0);
}

TEST(AdaptiveThreshold, ConfigRoundTripsAndBadValuesAreNamed) {
  MoDConfig c;
  c.mod_layers = {1, 2};
  c.adaptive_threshold = AdaptiveThreshold::kARank;
  c.layer_arank = {3.5, 7.25};
  c.avg_seqlen = 612.5;
  c.avg_seqlen_source = "mean tokens per sample of 8 first prompts of data.json";
  const auto j = to_json(c);
  EXPECT_EQ(j.at("adaptive_threshold"), "arank");
  const auto back = mod_config_from_json(j, "cfg");
  EXPECT_EQ(back.adaptive_threshold, AdaptiveThreshold::kARank);
  EXPECT_EQ(back.layer_arank, c.layer_arank);
  EXPECT_EQ(back.avg_seqlen, 612.5);
  EXPECT_EQ(back.avg_seqlen_source, c.avg_seqlen_source);
  EXPECT_EQ(to_json(back), j);
  auto err = [](MoDConfig m, const std::string& what) {
    try {
      validate(m, 4, "model/config.json: \"mod\"");
      ADD_FAILURE() << "accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("model/config.json"), std::string::npos) << e.what();
    }
  };
  auto m = c;
  m.layer_arank = {3.5};
  err(m, "layer_arank with one ARank per MoD layer (2), got 1");
  m.layer_arank = {3.5, 0.0};
  err(m, "layer_arank[1] = 0");
  m = c;
  m.adaptive_threshold = AdaptiveThreshold::kSeqLen;
  m.avg_seqlen = 0.0;
  err(m, "needs avg_seqlen > 0");
  m = c;
  m.router = RouterKind::kAttention;
  err(m, "router attention has none");
  EXPECT_THROW(mod_config_from_json({{"adaptive_threshold", "log"}}, "cfg"), std::invalid_argument);
  EXPECT_THROW(mod_config_from_json({{"layer_arank", "high"}}, "cfg"), std::invalid_argument);
}

// avg_seqlen as `gmod arank` / `gmod convert --avg-seqlen-data` measure it (mean_seqlen over the ARank
// samples): the mean over the first N image records, picked here from the JSON itself, of each one's prompt
// length, counted here from its own encoding (the tokens before its first supervised one). The batches have
// different lengths, so counting padding, text-only records or whole conversations shows.
TEST(AdaptiveThreshold, MeasuredAvgSeqLenIsTheMeanFirstPromptLengthOfTheImageRecords) {
  test::TempDir dir;
  DemoDatasetOptions o;
  o.num_train = 16;
  o.num_heldout = 1;
  o.image_size = 32;
  o.text_only_fraction = 0.3;
  o.multi_turn_fraction = 0.6;
  make_demo_dataset(dir.str(), o);
  DatasetConfig dc;
  dc.data_path = dir.str("train.json");
  dc.image_folder = dir.str();
  dc.conversation.image_seq_length = 4;
  dc.conversation.image_token_id = 800;
  dc.image.size = dc.image.crop = 28;
  dc.sample.max_len = 512;
  Dataset ds(dc, load_tokenizer(test::fixture("tokenizer/sp/tokenizer.model")));
  ARankSampling sampling;
  sampling.samples = 7;
  sampling.batch = 4;
  std::vector<size_t> order(ds.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  ARankSamplingStats stats;
  const auto m = mean_seqlen(arank_batches(ds, order, sampling, stats));

  std::ifstream f(dc.data_path);
  const auto records = nlohmann::json::parse(f);
  std::vector<int64_t> lengths;
  int64_t text_only = 0, multi_turn = 0;
  for (size_t i = 0; i < records.size() && lengths.size() < 7; ++i) {
    if (!records[i].contains("image")) {
      ++text_only;
      continue;
    }
    multi_turn += records[i].at("conversations").size() > 2;
    PreparedSample s;
    BadRecord bad;
    ASSERT_TRUE(ds.try_prepare(i, s, bad)) << bad.message;
    int64_t n = 0;
    while (s.sample.labels[size_t(n)] == kIgnoreIndex) ++n;
    lengths.push_back(n);
  }
  ASSERT_EQ(lengths.size(), 7u);
  ASSERT_GT(text_only, 0) << "no text-only record among them: skipping them would not show";
  ASSERT_GT(multi_turn, 0) << "no multi-turn record among them: cutting to the first prompt would not show";
  bool padded = false;  // some batch of `sampling.batch` consecutive samples has samples of different lengths
  for (size_t i = 0; i < lengths.size(); i += size_t(sampling.batch))
    padded |= std::set<int64_t>(lengths.begin() + long(i),
                                lengths.begin() + long(std::min(lengths.size(), i + size_t(sampling.batch))))
                  .size() > 1;
  ASSERT_TRUE(padded) << "no batch is padded: counting padding would not show";
  double sum = 0;
  for (int64_t n : lengths) sum += double(n);
  EXPECT_EQ(m.samples, 7);
  EXPECT_DOUBLE_EQ(m.mean, sum / 7.0);
  EXPECT_THROW(mean_seqlen({}), std::invalid_argument);
}

TEST(DirectGammaMoD, AttentionRuleOnADenseModelSkipsOnlyRoutableTokensAndCachesConsistently) {
  // A dense model, no training: the γ-MoD layer set, the router replaced by the attention rule (what gmod
  // convert
  // --direct writes): image ∪ system tokens that the previous layer attends to least are skipped.
  auto model = test::random_llava(4, 5);
  auto cfg = mod_config_from_json({{"router", "attention"},
                                   {"amod_routable", "roles"},
                                   {"amod_skipped", "carry"},
                                   {"mod_layers_idx", {1, 2, 3}},
                                   {"skip_frac", 0.5}},
                                  "direct");
  convert_to_mod(*model, cfg);
  model->eval();
  auto in = prompt();
  auto r = run(*model, in);
  auto routable = (in.token_roles == static_cast<int64_t>(TokenRole::kImage)) |
                  (in.token_roles == static_cast<int64_t>(TokenRole::kSystem));
  for (size_t i = 0; i < r.sel.size(); ++i) {
    auto skipped = in.attention_mask & r.sel[i].logical_not();
    EXPECT_FALSE((skipped & routable.logical_not()).any().item<bool>()) << "a non-routable token skipped";
    // skip_frac of each sample's routable tokens, floor.
    auto want = at::floor((routable & in.attention_mask).sum(1).to(at::kDouble) * 0.5).to(at::kLong);
    EXPECT_TRUE(at::equal(skipped.sum(1), want)) << "layer " << i;
  }
  GenerateOptions o;
  o.max_new_tokens = 5;
  o.eos_token_id = -1;
  test::expect_replay_equal(*model, in, o);
}

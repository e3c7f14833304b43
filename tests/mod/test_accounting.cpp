// Compute accounting (mod/accounting.h): hand-derived FLOPs of a small forward (decoder, head, vision, projector),
// dense and MoD on one formula (a MoD model's dense reference is the dense model's count on the same tokens), and
// generation: decode entries count only the samples a MoD layer really computed, and the dense reference of the
// whole generation equals the same generation run without MoD.
#include <ATen/record_function.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <numeric>

#include "mod/accounting.h"
#include "mod/conversion.h"
#include "mod/generate.h"
#include "tests/mod/mod_test_util.h"

using namespace gmod;

namespace {

LlavaConfig tiny_config() {
  LlavaConfig c;
  c.text.vocab_size = 10;
  c.text.hidden_size = 8;
  c.text.intermediate_size = 16;
  c.text.num_hidden_layers = 2;
  c.text.num_attention_heads = 2;
  c.text.num_key_value_heads = 2;
  return c;
}

// Rows that really went through an MLP during decode steps, counted at the kernels (aten::linear calls with a
// gate/up weight [F, D] on one-token inputs [P, 1, D]), independently of what the layers report.
std::atomic<int64_t> g_decode_mlp_rows{0};
std::atomic<int64_t> g_F{0}, g_D{0}, g_L{0};
// Full-sequence forwards: rows of gate/up calls whose inputs are not the batch's full length L (MoD
// compactions).
std::atomic<int64_t> g_compacted_mlp_rows{0};
std::unique_ptr<at::ObserverContext> count_mlp_rows(const at::RecordFunction& fn) {
  if (std::strcmp(fn.name(), "aten::linear") != 0) return nullptr;
  auto in = fn.inputs();
  if (in.size() < 2 || !in[0].isTensor() || !in[1].isTensor()) return nullptr;
  const at::Tensor &x = in[0].toTensor(), &w = in[1].toTensor();
  if (w.dim() != 2 || w.size(0) != g_F || w.size(1) != g_D || x.dim() != 3) return nullptr;
  if (x.size(1) == 1) g_decode_mlp_rows += x.size(0);
  if (x.size(1) != g_L) g_compacted_mlp_rows += x.size(0) * x.size(1);
  return nullptr;
}

}  // namespace

TEST(Accounting, HandDerivedForwardFlops) {
  const LlavaConfig c = tiny_config();
  // D 8, H = Hkv = 2, Dh 4, F 16: projections 2 (8*2*4 + 2*8*2*4 + 2*4*8 + 3*8*16) = 1280 per token;
  // 4 * H * Dh = 32 per causal query-key pair.
  EXPECT_DOUBLE_EQ(token_linear_flops(c.text), 1280.0);
  EXPECT_DOUBLE_EQ(attention_pair_flops(c.text), 32.0);
  // Samples of 3 and 2 valid tokens. Layer 0 dense: 5 tokens, 3*4/2 + 2*3/2 = 9 pairs -> 6400 + 288 = 6688.
  // Layer 1 MoD keeps 2 and 1: 3 tokens, 3 + 1 = 4 pairs -> 3840 + 128 = 3968 (dense reference 6688).
  // Head: 5 positions x 2 * 8 * 10 = 800.
  const std::vector<LayerTokens> tokens = {{0, 5, 5}, {1, 3, 5, 4}};
  const auto r = account_forward(tokens, c, ForwardShape::full({3, 2}));
  ASSERT_EQ(r.layers.size(), 2u);
  EXPECT_DOUBLE_EQ(r.layers[0].flops, 6688.0);
  EXPECT_DOUBLE_EQ(r.layers[0].dense_flops, 6688.0);
  EXPECT_DOUBLE_EQ(r.layers[1].flops, 3968.0);
  EXPECT_DOUBLE_EQ(r.layers[1].dense_flops, 6688.0);
  EXPECT_DOUBLE_EQ(r.head_flops, 800.0);
  EXPECT_DOUBLE_EQ(r.flops, 6688.0 + 3968.0 + 800.0);
  EXPECT_DOUBLE_EQ(r.dense_flops, 2 * 6688.0 + 800.0);
  EXPECT_DOUBLE_EQ(r.decoder_flop_ratio(), (6688.0 + 3968.0) / (2 * 6688.0));
  // A decode step: sample 0 has 7 cached tokens, sample 1 finished. Dense reference: 1 token, 8 pairs.
  ForwardShape d;
  d.context = {7, 0};
  d.fresh = {1, 0};
  const auto s = account_forward({{0, 1, 1}, {1, 0, 1, 0}}, c, d);  // the MoD layer skipped it
  EXPECT_DOUBLE_EQ(s.layers[0].flops, 1280.0 + 8 * 32.0);
  EXPECT_DOUBLE_EQ(s.layers[1].flops, 0.0);
  EXPECT_DOUBLE_EQ(s.layers[1].dense_flops, 1280.0 + 8 * 32.0);
  EXPECT_DOUBLE_EQ(s.head_flops, 160.0);
}

TEST(Accounting, HandDerivedVisionAndProjectorFlops) {
  LlavaConfig c = tiny_config();
  ClipVisionConfig v;
  v.hidden_size = 4;
  v.intermediate_size = 8;
  v.num_hidden_layers = 2;
  v.num_attention_heads = 1;
  v.image_size = 4;
  v.patch_size = 2;
  c.vision = v;
  c.vision_feature_layer = -2;  // runs 1 of the 2 layers
  // 4 patches + CLS = 5 tokens. Patch embedding 4 x 2 * (3*2*2) * 4 = 384; the layer: 5 x 2 (4*16 + 2*4*8) = 1280
  // plus 25 pairs x 4 * 4 = 400 -> 2064 per image. Projector: 4 tokens x 2 (4*8 + 8*8) = 768.
  EXPECT_DOUBLE_EQ(vision_tower_flops(c), 2064.0);
  EXPECT_DOUBLE_EQ(projector_flops(c), 768.0);
  {  // SigLIP: the 4 patches alone (no class token): 384 + 4 x 2 (4*16 + 2*4*8) + 16 pairs x 4 * 4 = 384 + 1024 + 256;
     // 'default' drops token 0 (a patch): 3 tokens into the projector, 3 x 96 x 2 = 576.
    LlavaConfig s = c;
    s.vision->model_type = "siglip_vision_model";
    EXPECT_DOUBLE_EQ(vision_tower_flops(s), 1664.0);
    EXPECT_DOUBLE_EQ(projector_flops(s), 576.0);
  }
  const auto r = account_forward({}, c, ForwardShape::full({}, 3));
  EXPECT_DOUBLE_EQ(r.vision_flops, 3 * 2064.0);
  EXPECT_DOUBLE_EQ(r.flops, 3 * (2064.0 + 768.0));
  EXPECT_DOUBLE_EQ(r.flops, r.dense_flops);
}

TEST(Accounting, MoDReportsTheDenseModelsCountAsItsReference) {
  auto in = test::text_inputs({16, 11, 7}, 16, 10, 4);
  auto dense = test::random_text_lm(4, 5);
  auto mod = test::random_text_lm(4, 5);
  MoDConfig cfg;
  cfg.mod_layers = {1, 2};
  cfg.mode = RoutingMode::kTopK;
  convert_to_mod(*mod, cfg);
  at::NoGradGuard ng;
  ForwardState sd, sm;
  dense->forward(in, sd);
  mod->forward(in, sm);
  const auto shape = ForwardShape::full(sample_lengths(in.attention_mask));
  const auto rd = account_forward(sd.tokens, dense->config, shape);
  const auto rm = account_forward(sm.tokens, mod->config, shape);
  EXPECT_DOUBLE_EQ(rd.flops, rd.dense_flops);
  EXPECT_DOUBLE_EQ(rm.dense_flops, rd.flops);  // the same formula on the same tokens
  EXPECT_LT(rm.flops, rm.dense_flops);
  EXPECT_GT(rm.mod_skip_ratio(), 0.0);
}

TEST(Accounting, BatchedDecodeComputesOnlyProcessingSamplesAndHasADenseReference) {
  auto p = test::fixture_inputs();
  p.labels = at::Tensor();
  GenerateOptions o;
  o.max_new_tokens = 6;
  o.eos_token_id = -1;  // every sample runs every step, whatever tokens it picks
  auto dense = test::random_llava(4, 3);
  dense->eval();
  auto mod = test::random_llava(4, 3);
  MoDConfig cfg;
  cfg.mod_layers = {1, 2, 3};
  convert_to_mod(*mod, cfg);
  {
    at::NoGradGuard ng;
    shared_router(*mod)->weight.mul_(40.0);  // spread p around the decode threshold 0.5
  }
  mod->eval();
  for (auto& l : mod_layers(*mod)) l->record_selection = true;
  const auto rd = generate(*dense, p, o);
  g_F = mod->config.text.intermediate_size;
  g_D = mod->config.text.hidden_size;
  g_decode_mlp_rows = 0;
  const auto handle = at::addGlobalCallback(at::RecordFunctionCallback(&count_mlp_rows).needsInputs(true));
  const auto rm = generate(*mod, p, o);
  at::removeCallback(handle);
  EXPECT_DOUBLE_EQ(rd.compute.flops, rd.compute.dense_flops);
  EXPECT_NEAR(rm.compute.dense_flops, rd.compute.flops, 1e-9 * rd.compute.flops)
      << "the MoD generation's dense reference is the dense generation's count";
  EXPECT_LT(rm.compute.flops, rm.compute.dense_flops);
  // Each decode entry of a MoD layer counts exactly the samples it processed: some, not all.
  int64_t partial = 0;
  for (const auto& l : mod_layers(*mod)) {
    for (size_t t = 1; t < l->recorded.size(); ++t) {
      const int64_t kept = l->recorded[t].sum().item<int64_t>();
      partial += kept > 0 && kept < 3;
    }
  }
  EXPECT_GT(partial, 0) << "the test needs decode steps where only some samples process";
  // What the decode entries report (every layer, dense and MoD) against the rows the MLP kernels ran on (gate
  // and up projections: two calls per layer and step).
  int64_t decode_processed = 0;
  const size_t n_layers = 4, prefill = n_layers;
  for (size_t i = prefill; i < rm.layer_tokens.size(); ++i) decode_processed += rm.layer_tokens[i].processed;
  ASSERT_GT(g_decode_mlp_rows.load(), 0) << "no decode rows counted at the kernels";
  EXPECT_EQ(2 * decode_processed, g_decode_mlp_rows.load());
  // The dense layer 0 runs all 3 samples at each of the 5 decode steps: the MoD layers processed fewer.
  EXPECT_LT(decode_processed, int64_t(n_layers) * 3 * (o.max_new_tokens - 1));
}

// Ragged batches: a training MoD layer compacts its kept tokens to [B, k_max] and its projections run on all
// B x k_max rows. With the capacity plan's k_max in the shape, the accounting credits exactly the rows the
// MLP kernels ran on (counted at aten::linear), not the Σ k_b kept tokens; processed (the routing decision)
// stays Σ k_b.
TEST(Accounting, RaggedMoDBatchIsCreditedTheRowsItComputes) {
  auto m = test::random_text_lm(4, 7);
  MoDConfig cfg;
  cfg.mod_layers = {1, 2};
  cfg.skip_frac = 0.5;
  convert_to_mod(*m, cfg);
  m->train();
  const std::vector<int64_t> lengths = {30, 21, 9};
  const int64_t L = 30, B = 3;
  ModelInputs in = test::text_inputs(lengths, L, 18, 4);
  in.host_role_counts = count_routing_roles(in.token_roles, in.attention_mask, B, L);
  const HostCapacity plan = host_capacity(in.host_role_counts, cfg.skip_frac, cfg.forced_keep, false);
  ASSERT_NE(plan.k.front(), plan.k.back()) << "the test needs ragged kept counts";
  g_F = m->config.text.intermediate_size;
  g_D = m->config.text.hidden_size;
  g_L = L;
  g_compacted_mlp_rows = 0;
  ForwardState st;
  const auto handle = at::addGlobalCallback(at::RecordFunctionCallback(&count_mlp_rows).needsInputs(true));
  m->forward(in, st);
  at::removeCallback(handle);
  ForwardShape shape = ForwardShape::full(lengths);
  shape.mod_kmax = plan.kmax;
  const ComputeReport r = account_forward(st.tokens, m->config, shape);
  int64_t computed = 0, processed = 0;
  double linear = 0;
  for (const auto& l : r.layers)
    if (l.mod) computed += l.computed, processed += l.processed, linear += l.linear_flops;
  EXPECT_EQ(2 * computed, g_compacted_mlp_rows.load()) << "gate + up rows the kernels ran on";
  EXPECT_GT(computed, processed) << "padding rows of the ragged compaction";
  EXPECT_EQ(processed, 2 * std::accumulate(plan.k.begin(), plan.k.end(), int64_t(0)));
  EXPECT_DOUBLE_EQ(linear, double(computed) * token_linear_flops(m->config.text));
}

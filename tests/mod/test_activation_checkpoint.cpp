// Activation checkpointing per decoder layer (model/activation_checkpoint.h): dense, γ-MoD, per-layer-router
// and A-MoD models give bitwise the same logits, losses, accounting and parameter gradients with none / full
// / every_2 checkpointing (fp32 and bf16 on CPU); frozen leading layers; the MoD layer's routing replay;
// inference paths (no grad, KV caches, attention maps) never checkpoint; config parsing.
#include <gtest/gtest.h>

#include "mod/conversion.h"
#include "model/activation_checkpoint.h"
#include "tests/mod/mod_test_util.h"

using namespace gmod;

namespace {

// Norm weights drawn from [0.5, 1.5) so that a gradient wrongly routed through a norm would show.
void randomise_norms(MultimodalLM& m, uint64_t seed) {
  at::NoGradGuard ng;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& p : m.named_parameters())
    if (p.key().find("norm") != std::string::npos)
      p.value().copy_(at::empty(p.value().sizes(), at::kFloat).uniform_(0.5, 1.5, gen).to(p.value().dtype()));
}

std::shared_ptr<MultimodalLM> make_model(int layers, at::ScalarType dtype, const MoDConfig* mod) {
  auto m = test::random_text_lm(layers, 21);
  if (mod) convert_to_mod(*m, *mod);
  randomise_norms(*m, 5);
  m->to(dtype);
  m->train();
  return m;
}

ModelInputs make_inputs() {
  auto in = test::text_inputs({24, 17, 11}, 24, 14, 4);  // right-padded, 12 routable tokens each
  in.labels = in.input_ids.masked_fill(in.attention_mask.logical_not(), -100);
  return in;
}

MoDConfig mod_config(RouterKind kind) {
  MoDConfig c;
  c.router = kind;
  c.mod_layers = {1, 2, 3};
  c.router_aux_loss_coef = 0.5;
  if (kind == RouterKind::kAttention) {  // consecutive A-MoD layers: the carried-score adaptation
    c.amod_skipped = AmodSkippedScore::kCarry;
    c.amod_causal_normalise = true;
    c.amod_routable = AmodRoutable::kRoles;
  }
  return c;
}

struct Pass {
  at::Tensor logits, loss;
  std::vector<std::pair<std::string, at::Tensor>> grads;  // undefined = no gradient
  std::vector<LayerTokens> tokens;
  size_t aux_losses = 0;
};

Pass run(MultimodalLM& m, const ModelInputs& in, const MoDConfig* mod, const std::string& ckpt) {
  m.llm->activation_checkpointing = parse_activation_checkpointing(ckpt);
  m.zero_grad();
  ForwardState st;
  ModelOutput out = m.forward(in, st);
  Pass r;
  r.loss = out.lm_loss;
  if (mod && !st.aux_losses.empty()) r.loss = r.loss + total_routing_loss(st, *mod);
  r.loss.backward();
  r.logits = out.logits.detach();
  r.loss = r.loss.detach();
  for (const auto& p : m.named_parameters())
    r.grads.emplace_back(p.key(), p.value().grad().defined() ? p.value().grad().clone() : at::Tensor());
  r.tokens = st.tokens;
  r.aux_losses = st.aux_losses.size();
  return r;
}

void expect_identical(const Pass& ref, const Pass& got, const std::string& what) {
  EXPECT_TRUE(at::equal(ref.logits, got.logits)) << what << ": logits";
  EXPECT_TRUE(at::equal(ref.loss, got.loss))
      << what << ": loss " << ref.loss.item<double>() << " vs " << got.loss.item<double>();
  EXPECT_EQ(ref.aux_losses, got.aux_losses) << what << ": auxiliary losses reported once per layer";
  ASSERT_EQ(ref.tokens.size(), got.tokens.size()) << what << ": per-layer accounting reported once per layer";
  for (size_t i = 0; i < ref.tokens.size(); ++i) {
    EXPECT_EQ(ref.tokens[i].layer, got.tokens[i].layer) << what;
    EXPECT_EQ(ref.tokens[i].processed, got.tokens[i].processed) << what << ": layer " << ref.tokens[i].layer;
    EXPECT_EQ(ref.tokens[i].attn_pairs, got.tokens[i].attn_pairs)
        << what << ": layer " << ref.tokens[i].layer;
  }
  ASSERT_EQ(ref.grads.size(), got.grads.size());
  for (size_t i = 0; i < ref.grads.size(); ++i) {
    const auto& [name, g] = ref.grads[i];
    const at::Tensor& h = got.grads[i].second;
    ASSERT_EQ(g.defined(), h.defined()) << what << ": gradient of " << name << " defined in one run only";
    if (!g.defined()) continue;
    EXPECT_TRUE(at::equal(g, h)) << what << ": gradient of " << name << " differs, max abs diff "
                                 << (g.to(at::kDouble) - h.to(at::kDouble)).abs().max().item<double>();
  }
}

void expect_checkpointing_exact(MultimodalLM& m, const MoDConfig* mod, const std::string& label) {
  const auto in = make_inputs();
  const Pass ref = run(m, in, mod, "none");
  for (const char* mode : {"full", "every_2", "every_3"})
    expect_identical(ref, run(m, in, mod, mode), label + " " + mode);
}

at::Tensor grad_of(const Pass& r, const std::string& name) {
  for (const auto& [n, g] : r.grads)
    if (n == name) return g;
  throw std::runtime_error("no parameter " + name);
}

}  // namespace

TEST(ActivationCheckpointing, ParsesNoneFullAndEveryK) {
  EXPECT_FALSE(parse_activation_checkpointing("none").enabled());
  const auto full = parse_activation_checkpointing("full");
  EXPECT_TRUE(full.applies(0) && full.applies(1) && full.applies(7));
  const auto e3 = parse_activation_checkpointing("every_3");
  EXPECT_TRUE(e3.applies(0) && e3.applies(3) && e3.applies(6));
  EXPECT_FALSE(e3.applies(1) || e3.applies(2) || e3.applies(4));
  EXPECT_EQ(e3.to_string(), "every_3");
  EXPECT_EQ(parse_activation_checkpointing("every_1").to_string(), "full");
  for (const char* bad : {"", "all", "every_", "every_0", "every_-2", "every_2x", "Full"})
    EXPECT_THROW(parse_activation_checkpointing(bad), std::invalid_argument) << bad;
}

TEST(ActivationCheckpointing, DenseGradientsBitwiseEqualFp32) {
  auto m = make_model(4, at::kFloat, nullptr);
  expect_checkpointing_exact(*m, nullptr, "dense");
}

TEST(ActivationCheckpointing, GammaModGradientsBitwiseEqualFp32) {
  const MoDConfig cfg = mod_config(RouterKind::kGammaShared);
  auto m = make_model(4, at::kFloat, &cfg);
  expect_checkpointing_exact(*m, &cfg, "γ-MoD");
  // The shared router gets its gradient (routing loss + MLP scaling) through every checkpointed MoD layer.
  const Pass r = run(*m, make_inputs(), &cfg, "full");
  EXPECT_GT(grad_of(r, "mod_router.weight").abs().sum().item<double>(), 0.0);
  EXPECT_EQ(r.aux_losses, 3u);
}

TEST(ActivationCheckpointing, PerLayerRouterAndAttentionRoutedModBitwiseEqualFp32) {
  for (RouterKind kind : {RouterKind::kPerLayer, RouterKind::kAttention}) {
    const MoDConfig cfg = mod_config(kind);
    auto m = make_model(4, at::kFloat, &cfg);
    const std::string label = kind == RouterKind::kPerLayer ? "per-layer router" : "A-MoD";
    expect_checkpointing_exact(*m, &cfg, label);
    if (kind == RouterKind::kAttention) {  // scores carried from a layer to the next decide what is skipped
      const Pass r = run(*m, make_inputs(), &cfg, "every_2");
      for (const auto& t : r.tokens) {
        if (t.layer >= 1) {
          EXPECT_LT(t.processed, t.total) << label << " layer " << t.layer;
        }
      }
    }
  }
}

TEST(ActivationCheckpointing, PaperAModBitwiseEqualFp32) {
  MoDConfig cfg;  // A-MoD defaults: interleaved, every token routable, 1/N scores from the attention's lse
  cfg.router = RouterKind::kAttention;
  cfg.mod_layers = {1, 3};
  auto m = make_model(4, at::kFloat, &cfg);
  expect_checkpointing_exact(*m, &cfg, "A-MoD (paper)");
}

TEST(ActivationCheckpointing, Bf16GradientsBitwiseEqual) {
  const MoDConfig cfg = mod_config(RouterKind::kGammaShared);
  auto dense = make_model(3, at::kBFloat16, nullptr);
  expect_checkpointing_exact(*dense, nullptr, "dense bf16");
  auto mod = make_model(4, at::kBFloat16, &cfg);
  expect_checkpointing_exact(*mod, &cfg, "γ-MoD bf16");
}

TEST(ActivationCheckpointing, FrozenLeadingLayersAndEmbeddings) {
  // Layer 0's input and parameters need no gradient (plain forward); layer 1 is checkpointed with an input
  // that needs none but trainable parameters.
  const MoDConfig cfg = mod_config(RouterKind::kGammaShared);
  auto m = make_model(4, at::kFloat, &cfg);
  for (auto& p : m->named_parameters())
    if (p.key().rfind("llm.layers.0.", 0) == 0 || p.key() == "llm.embed_tokens.weight")
      p.value().requires_grad_(false);
  expect_checkpointing_exact(*m, &cfg, "frozen layer 0");
  const Pass r = run(*m, make_inputs(), &cfg, "full");
  EXPECT_FALSE(grad_of(r, "llm.layers.0.mlp.up_proj.weight").defined());
  EXPECT_TRUE(grad_of(r, "llm.layers.1.mlp.up_proj.weight").defined());
}

TEST(ActivationCheckpointing, ModLayerReplaysTheRecordedSelection) {
  // The recompute must process the first pass's tokens whatever the scores say: kReplay takes
  // routing_selection (here deliberately not the top-k) and still reports the routing loss against it.
  const MoDConfig cfg = mod_config(RouterKind::kGammaShared);
  auto m = make_model(4, at::kFloat, &cfg);
  const auto in = make_inputs();
  auto layer = mod_layers(*m)[0];
  layer->record_selection = true;
  ForwardState st;
  prepare_forward_state(st, in.input_ids, in.attention_mask, in.positions);
  st.token_roles = in.token_roles;
  st.rope = &m->llm->rope;
  std::tie(st.cos, st.sin) = m->llm->rope.cos_sin(st.positions, at::kFloat);
  const auto h = at::randn({3, 24, 32});

  ForwardState rec = st;
  rec.routing_pass = RoutingPass::kRecord;
  layer->forward(h, rec, 1);
  ASSERT_TRUE(rec.routing_selection.defined());
  EXPECT_TRUE(at::equal(rec.routing_selection, layer->recorded.at(0)));

  ForwardState rep = st;
  rep.routing_pass = RoutingPass::kReplay;
  // Not the top-k, but with the first pass's per-sample counts (a real replay is the first pass's selection, and
  // the capacities come from the host): every sample drops position 3 if it was kept and takes the first unselected
  // routable position instead, else swaps its first kept routable token for an unselected one.
  rep.routing_selection = rec.routing_selection.clone();
  {
    auto a = rep.routing_selection.accessor<bool, 2>();
    for (int64_t b = 0; b < 3; ++b) {
      int64_t drop = a[b][3] ? 3 : -1, take = -1;
      for (int64_t i = 2; i < 14; ++i) {  // the routable (image-role) span
        if (drop < 0 && a[b][i] && i != 3) drop = i;
        if (take < 0 && !a[b][i] && i != 3) take = i;
      }
      ASSERT_GE(drop, 0);
      ASSERT_GE(take, 0);
      a[b][drop] = false;
      a[b][take] = true;
    }
  }
  ASSERT_FALSE(at::equal(rep.routing_selection, rec.routing_selection));
  auto out = layer->forward(h, rep, 1);
  EXPECT_EQ(layer->recorded.size(), 1u) << "a replayed pass is not recorded again";
  ASSERT_EQ(rep.tokens.size(), 1u);
  EXPECT_EQ(rep.tokens[0].processed, rep.routing_selection.sum().item<int64_t>());
  EXPECT_EQ(rep.aux_losses.size(), 1u);
  EXPECT_TRUE(at::equal(out.select(1, 3), h.select(1, 3))) << "position 3 was not in the replayed selection";

  ForwardState bad = st;
  bad.routing_pass = RoutingPass::kReplay;
  EXPECT_THROW(layer->forward(h, bad, 1), std::logic_error) << "replay without a recorded selection";
}

TEST(ActivationCheckpointing, InferencePathsDoNotCheckpoint) {
  auto m = make_model(3, at::kFloat, nullptr);
  const auto in = make_inputs();
  ForwardState base;
  prepare_forward_state(base, in.input_ids, in.attention_mask, in.positions);
  base.rope = &m->llm->rope;
  std::tie(base.cos, base.sin) = m->llm->rope.cos_sin(base.positions, at::kFloat);
  const auto& block = (*m->llm->layers)[1];
  const auto h = at::randn({3, 24, 32}).requires_grad_();
  const std::string node = "CheckpointedBlockBackward";

  ForwardState train = base;
  auto y = checkpointed_forward(block, h, train, 1);
  ASSERT_TRUE(y.grad_fn());
  EXPECT_EQ(y.grad_fn()->name(), node);
  EXPECT_EQ(train.tokens.size(), 1u);
  {
    at::NoGradGuard ng;
    ForwardState st = base;
    EXPECT_FALSE(checkpointed_forward(block, h, st, 1).requires_grad());
  }
  ForwardState probs = base;
  probs.want_attn_probs = true;
  auto yp = checkpointed_forward(block, h, probs, 1);
  EXPECT_NE(yp.grad_fn()->name(), node);
  EXPECT_EQ(probs.attn_probs.size(), 1u) << "ARank's attention maps";
  std::vector<KVCache> caches(3);
  ForwardState gen = base;
  gen.caches = &caches;
  auto yc = checkpointed_forward(block, h, gen, 1);
  EXPECT_NE(yc.grad_fn()->name(), node);
  EXPECT_TRUE(caches[1].k.defined()) << "generation fills the layer's KV cache";
  EXPECT_TRUE(at::allclose(y, yp, 1e-5, 1e-5) && at::allclose(y, yc, 1e-5, 1e-5));  // explicit vs fused attention

  // Whole model with every layer checkpointed: attention maps of every layer, as without checkpointing.
  m->llm->activation_checkpointing = parse_activation_checkpointing("full");
  ForwardState st;
  st.want_attn_probs = true;
  m->forward(in, st);
  EXPECT_EQ(st.attn_probs.size(), 3u);
}

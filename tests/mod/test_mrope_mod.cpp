// Every MoD method under Qwen2.5-VL's 3-D rotary positions (M-RoPE, mod/kept_positions.h), on the tiny
// transformers Qwen2.5-VL of tests/fixtures/make_qwen2_5_vl_fixtures.py (2 layers, images of different grids, a
// left-padded and a text-only row) and the references of make_qwen2_5_vl_mod_fixtures.py:
// - a MoD layer (each method, its selection forced to the fixture's) matches transformers' Qwen2_5_VLDecoderLayer run
//   on the gathered tokens at their gathered [3, B, K] ids, within 1e-5 (test_hf_parity.cpp's logit bound);
// - at capacity 1.0 the MoD model's logits equal the dense model's and transformers';
// - ARank's layer-by-layer forward gives transformers' maps' ARank;
// - PyramidDrop's rank pass keeps the image tokens transformers' attention at the 3-D ids ranks first;
// - each method trains a step on an image batch (finite loss, router gradients), with activation checkpointing too;
// - packed rows get per-sample 3-D ids (the packed forward equals the unpacked one);
// - greedy generation with images equals transformers' generate (tokens and every step's logits) and, with MoD layers
//   skipping in prefill and decode, the full forward with the routing replayed at the 3-D positions; an image prompt
//   joining a running batch decodes as transformers' generate of it alone.
// Planted bug (by hand, noted in docs/mod.md): the kept tokens at 1-D positions turns the first case red.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <limits>

#include "mod/arank.h"
#include "mod/conversion.h"
#include "mod/decode_batch.h"
#include "mod/fastv.h"
#include "mod/generate.h"
#include "mod/mod_layer.h"
#include "mod/pdrop.h"
#include "mod/pmod.h"
#include "model/activation_checkpoint.h"
#include "model/llava.h"
#include "model/mrope.h"
#include "model/segments.h"
#include "tests/mod/mod_test_util.h"

namespace gmod {
namespace {

std::string full_dir() { return test::fixture("qwen2_5_vl/full"); }
std::string mod_ref() { return test::fixture("qwen2_5_vl/mod/reference.safetensors"); }

ModelInputs batch(const MultimodalLM& model) {
  return test::native_reference_inputs(full_dir() + "/reference.safetensors", model);
}

// Rows 0 and 1 of the fixture batch as prompts, each row's tokens moved to the front (right padding), with their
// images; lengths[b] = row b's token count.
struct Prompts {
  ModelInputs in;
  int64_t lengths[2];
};

Prompts right_padded_prompts(const MultimodalLM& model, const ModelInputs& full) {
  const auto mask = full.attention_mask;
  Prompts r{{}, {mask[0].sum().item<int64_t>(), mask[1].sum().item<int64_t>()}};
  const int64_t L = std::max(r.lengths[0], r.lengths[1]);
  ModelInputs& p = r.in;
  p.input_ids = at::zeros({2, L}, at::kLong);
  p.attention_mask = at::zeros({2, L}, at::kBool);
  for (int64_t b = 0; b < 2; ++b) {
    p.input_ids[b].narrow(0, 0, r.lengths[b]).copy_(full.input_ids[b].masked_select(mask[b]));
    p.attention_mask[b].narrow(0, 0, r.lengths[b]).fill_(true);
  }
  p.token_roles = test::make_roles(p.input_ids, p.attention_mask, model.config.image_token_id);
  const auto patches = full.image_grid_thw.prod(1);
  p.pixel_values = full.pixel_values.narrow(0, 0, patches.sum().item<int64_t>());
  p.image_grid_thw = full.image_grid_thw;
  return r;
}

// Every method with its one MoD layer at layer 1 of the 2-layer model, kept tokens at their original positions.
struct Method {
  const char* name;
  MoDConfig cfg;
};

std::vector<Method> methods() {
  auto with = [](MoDConfig c) {
    c.rope_positions = RopePositions::kOriginal;
    return c;
  };
  MoDConfig gamma;
  gamma.mod_layers = {1};
  MoDConfig per_layer = gamma;
  per_layer.router = RouterKind::kPerLayer;
  MoDConfig amod = gamma;
  amod.router = RouterKind::kAttention;
  return {{"gamma_shared", with(gamma)},
          {"per_layer", with(per_layer)},
          {"amod", with(amod)},
          {"fastv", with(fastv_config(1, 0.5, 2))},
          {"pmod", with(config_for_rule("pmod", MoDConfig{}, 2))},
          {"pdrop", with(config_for_rule("pdrop:1:0.5", MoDConfig{}, 2))}};
}

std::shared_ptr<MultimodalLM> converted(const MoDConfig& cfg) {
  auto m = load_pretrained(full_dir());
  convert_to_mod(*m, cfg);
  return m;
}

TEST(MRopeMoD, KeptTokensMatchTransformersLayerAtTheirGathered3DPositions) {
  SafetensorsFile ref(mod_ref());
  const auto hidden = ref.tensor("hidden"), sel = ref.tensor("selection").to(at::kBool);
  const auto want = ref.tensor("output"), want_1d = ref.tensor("output_1d"), counts = ref.tensor("counts");
  const int64_t K = want.size(1);
  const auto slot_valid = at::arange(K).unsqueeze(0) < counts.unsqueeze(1);  // [B, K]
  // The case tells 3-D from 1-D positions by far more than the tolerance.
  ASSERT_GT(test::max_abs_valid(want, want_1d, slot_valid), 1e-2);
  for (const auto& [name, base] : methods()) {
    MoDConfig cfg = base;
    cfg.scale_by_router = false;  // the layer's output is then the decoder layer's (p-MoD: on kept tokens)
    auto model = converted(cfg);
    model->train(true);
    auto layers = mod_layers(*model);
    ASSERT_EQ(layers.size(), 1u) << name;
    layers[0]->forced_selection = sel;
    auto in = batch(*model);
    ForwardState st;
    prepare_forward_state(st, in);
    st.mrope_positions = ref.tensor("position_ids");
    st.rope = &model->llm->rope;
    std::tie(st.cos, st.sin) = model->llm->mrope->cos_sin(st.mrope_positions, at::kFloat);
    at::NoGradGuard ng;
    const auto out = layers[0]->forward(hidden, st, 1);  // [B, L, D]
    const auto kept = gather_tokens(out, compact(sel).index);  // [B, K, D], kept tokens in order
    const double err = test::max_abs_valid(kept, want, slot_valid);
    EXPECT_LT(err, 1e-5) << name << ": kept tokens' outputs against transformers' layer on the gathered tokens";
    std::cout << "M-RoPE MoD layer (" << name << "): max abs diff " << err << " on " << counts.sum().item<int64_t>()
              << " kept tokens (at 1-D positions the layer's output lies "
              << test::max_abs_valid(want_1d, want, slot_valid) << " away)\n";
    if (std::string(name) == "gamma_shared") {  // skipped tokens leave the layer as they came
      const auto skipped = in.attention_mask & sel.logical_not();
      EXPECT_TRUE(out.masked_select(skipped.unsqueeze(-1)).equal(hidden.masked_select(skipped.unsqueeze(-1))));
    }
  }
}

// PyramidDrop's rank pass at a boundary in layer 1 keeps each sample's top half of its image tokens by the attention
// of its instruction query: with the queries pdrop_queries picks, the kept set is the one transformers' layer-1
// attention probabilities at the 3-D ids give (the fixture's eager attention over each row's real tokens).
TEST(MRopeMoD, PDropRankUsesTheAttentionAt3DPositions) {
  SafetensorsFile ref(mod_ref());
  auto cfg = methods().back().cfg;
  ASSERT_EQ(cfg.router, RouterKind::kPDrop);
  auto model = converted(cfg);
  model->train(true);
  auto layer = mod_layers(*model).at(0);
  auto in = batch(*model);
  ForwardState st;
  prepare_forward_state(st, in);
  st.mrope_positions = ref.tensor("position_ids");
  st.rope = &model->llm->rope;
  std::tie(st.cos, st.sin) = model->llm->mrope->cos_sin(st.mrope_positions, at::kFloat);
  const auto valid = in.attention_mask;
  const auto kept = pdrop_rank(*layer, ref.tensor("hidden"), st, valid, 1);  // [B, L]

  const auto c = compact(valid);
  const auto roles_c = in.token_roles.to(at::kLong).gather(1, c.index);
  const auto queries = pdrop_queries(roles_c, c.valid, false);
  const auto probs = ref.tensor("attn_probs");  // [B, H, L, L], real tokens first
  const int64_t B = valid.size(0), K = c.kmax;
  int ranked = 0;
  for (int64_t b = 0; b < B; ++b) {
    const auto image_c = c.valid[b] & (roles_c[b] == static_cast<int64_t>(TokenRole::kImage));
    const int64_t n_img = image_c.sum().item<int64_t>();
    if (n_img == 0) continue;
    const auto q = queries[b].nonzero().squeeze(1);
    ASSERT_GT(q.numel(), 0) << "row " << b;
    // Mean over heads and query rows of transformers' probabilities, over the compacted slots.
    const auto score = probs[b].narrow(1, 0, K).narrow(2, 0, K).index_select(1, q).mean(at::IntArrayRef{0, 1});  // [K]
    const int64_t keep = pdrop_kept_images(n_img, 0.5);
    const auto key = at::where(image_c, score, at::full_like(score, -1.0));
    const auto order = std::get<1>(key.sort(0, /*descending=*/true));
    // Far from a tie: the last kept and the first dropped image token differ by more than rounding.
    EXPECT_GT((key[order[keep - 1]] - key[order[keep]]).item().toDouble(), 1e-6) << "row " << b;
    auto want = at::zeros({K}, at::kBool).index_fill(0, order.narrow(0, 0, keep), true);
    const auto got_c = kept[b].gather(0, c.index[b]) & image_c;
    EXPECT_TRUE(got_c.equal(want)) << "row " << b << ": kept image slots " << got_c.nonzero().flatten()
                                   << " vs transformers' top " << keep << " " << want.nonzero().flatten();
    ++ranked;
  }
  EXPECT_EQ(ranked, 2);
}

// ARank (γ-MoD's conversion rule) runs the dense model layer by layer at the batch's 3-D ids, with the images'
// grids: layer 1's ARank is that of transformers' layer-1 attention maps at those ids (the fixture's eager maps).
TEST(MRopeMoD, ARankUsesTheAttentionMapsAt3DPositions) {
  auto model = load_pretrained(full_dir());
  auto in = batch(*model);
  const auto r = compute_arank(*model, {in});
  ASSERT_EQ(r.layers.size(), 2u);
  SafetensorsFile ref(mod_ref());
  const auto probs = ref.tensor("attn_probs");
  ARankAccumulator acc(2);
  double worst = std::numeric_limits<double>::infinity();
  for (int64_t b = 0; b < probs.size(0); ++b) {
    const int64_t n = in.attention_mask[b].sum().item<int64_t>();
    const auto maps = probs[b].narrow(1, 0, n).narrow(2, 0, n);
    acc.add(1, attention_rank(maps));
    // No singular value near the rank's cut (σ_max · n · eps_fp32, arank.h): maps this close to transformers' have
    // the same ranks under other kernels.
    const auto sv = at::linalg_svdvals(maps - at::diag_embed(maps.diagonal(0, -2, -1)));  // [H, n]
    const auto cut = sv.select(1, 0) * static_cast<double>(n) * std::numeric_limits<float>::epsilon();
    const double margin = ((sv - cut.unsqueeze(1)).abs() / cut.unsqueeze(1)).min().item<double>();
    EXPECT_GT(margin, 1e-2) << "row " << b << ": a singular value within " << margin << " of the rank's cut";
    worst = std::min(worst, margin);
  }
  const auto want = acc.result().layers[1];
  EXPECT_EQ(r.layers[1].mean, want.mean);
  EXPECT_EQ(r.layers[1].std, want.std);
  std::cout << "M-RoPE ARank of layer 1: " << r.layers[1].mean << " (transformers' maps: " << want.mean
            << "; nearest singular value " << worst << " of the cut away, relative)\n";
}

// At capacity 1.0 (every token kept, no router scaling) the MoD model is the dense one under M-RoPE.
TEST(MRopeMoD, FullCapacityEqualsDenseAndTransformers) {
  auto dense = load_pretrained(full_dir());
  auto in = batch(*dense);
  SafetensorsFile ref(full_dir() + "/reference.safetensors");
  at::NoGradGuard ng;
  const auto want = dense->forward(in).logits;
  for (const auto& [name, base] : methods()) {
    const std::string n = name;
    if (n == "fastv" || n == "pdrop" || n == "pmod") continue;  // their capacity is a ratio of image tokens
    MoDConfig cfg = base;
    cfg.skip_frac = 0.0;
    cfg.scale_by_router = false;
    auto model = converted(cfg);
    model->train(true);
    ForwardState st;
    const auto got = model->forward(in, st).logits;
    for (const auto& t : st.tokens) EXPECT_EQ(t.processed, t.total) << name;
    EXPECT_LT(test::max_abs_valid(got, want, in.attention_mask), 1e-5) << name << " against dense";
    EXPECT_LT(test::max_abs_valid(got, ref.tensor("logits"), in.attention_mask), 1e-5)
        << name << " against transformers";
  }
  // p-MoD keeping every image token (ratio 1) and PyramidDrop keeping them all (ratio 1.0).
  auto pdrop = config_for_rule("pdrop:1:1.0", MoDConfig{}, 2);
  pdrop.rope_positions = RopePositions::kOriginal;
  auto model = converted(pdrop);
  model->train(true);
  EXPECT_LT(test::max_abs_valid(model->forward(in).logits, want, in.attention_mask), 1e-5) << "pdrop at ratio 1";
}

// One training step per method on the image batch: finite loss, tokens skipped, gradients on the routers (on the
// layer's attention for the parameter-free methods); with activation checkpointing (γ-MoD, PyramidDrop) the same loss
// and gradients.
TEST(MRopeMoD, EveryMethodTrainsOnAnImageBatch) {
  for (const auto& [name, cfg] : methods()) {
    std::vector<double> losses;
    std::vector<at::Tensor> grads;
    const std::string n = name;
    const bool both = n == "gamma_shared" || n == "pdrop";  // checkpointed too: the MoD layer's and the rank's path
    for (const char* ckpt : {"none", "full"}) {
      if (!both && std::string(ckpt) == "full") continue;
      auto model = converted(cfg);
      model->llm->activation_checkpointing = parse_activation_checkpointing(ckpt);
      model->train(true);
      auto in = batch(*model);
      ForwardState st;
      auto out = model->forward(in, st);
      auto loss = out.lm_loss;
      if (auto r = total_routing_loss(st, cfg); r.defined()) loss = loss + r;
      ASSERT_TRUE(std::isfinite(loss.item<double>())) << name;
      loss.backward();
      bool skipped = false;
      for (const auto& t : st.tokens) skipped |= t.layer == 1 && t.processed < t.total;
      EXPECT_TRUE(skipped) << name << ": layer 1 skips tokens";
      auto layer = mod_layers(*model).at(0);
      at::Tensor g;
      if (auto r = shared_router(*model)) g = r->weight.grad();
      else if (layer->router) g = layer->router->weight.grad();
      else if (layer->pmod_router) g = layer->pmod_router->weight.grad();
      else g = layer->self_attn->q_proj->weight.grad();
      ASSERT_TRUE(g.defined()) << name << " (" << ckpt << ")";
      EXPECT_GT(g.abs().max().item<double>(), 0.0) << name;
      losses.push_back(loss.item<double>());
      grads.push_back(g.clone());
    }
    // Checkpointed layers recompute at the same 3-D positions (ForwardState::mrope_positions travels with them).
    if (!both) continue;
    EXPECT_NEAR(losses[0], losses[1], 1e-6) << name;
    EXPECT_LT((grads[0] - grads[1]).abs().max().item<double>(), 1e-6) << name;
  }
}

TEST(MRopeMoD, CompactedPositionsAreRefusedForMRopeModels) {
  MoDConfig cfg;
  cfg.mod_layers = {1};
  ASSERT_EQ(cfg.rope_positions, RopePositions::kCompacted);
  auto model = load_pretrained(full_dir());
  try {
    convert_to_mod(*model, cfg);
    ADD_FAILURE() << "rope_positions compacted must be refused on an M-RoPE model";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("rope_positions \"compacted\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("\"original\""), std::string::npos) << e.what();
  }
}

// Rows 0 and 1 of the batch (row 1 without its left padding) packed into one row: per-segment 3-D ids, so the
// packed forward's logits equal the unpacked batch's, dense and with γ-MoD and PyramidDrop (its rank pass on the
// segment-major view) routing each segment.
TEST(MRopeMoD, PackedRowsTakePerSample3DPositions) {
  auto probe = load_pretrained(full_dir());
  auto full = batch(*probe);
  const auto mask = full.attention_mask;
  const int64_t n0 = mask[0].sum().item<int64_t>(), n1 = mask[1].sum().item<int64_t>();
  ASSERT_EQ(n0, mask.size(1));
  const auto real1 = full.input_ids[1].masked_select(mask[1]);
  const auto roles1 = full.token_roles[1].masked_select(mask[1]);
  const auto patches = full.image_grid_thw.narrow(0, 0, 3).prod(1);
  const int64_t p01 = patches.narrow(0, 0, 2).sum().item<int64_t>(), p2 = patches[2].item<int64_t>();

  ModelInputs unpacked;  // two right-padded rows
  unpacked.input_ids = at::zeros({2, n0}, at::kLong);
  unpacked.input_ids[0].copy_(full.input_ids[0]);
  unpacked.input_ids[1].narrow(0, 0, n1).copy_(real1);
  unpacked.attention_mask = at::zeros({2, n0}, at::kBool);
  unpacked.attention_mask[0].fill_(true);
  unpacked.attention_mask[1].narrow(0, 0, n1).fill_(true);
  unpacked.token_roles = at::zeros({2, n0}, at::kChar);
  unpacked.token_roles[0].copy_(full.token_roles[0]);
  unpacked.token_roles[1].narrow(0, 0, n1).copy_(roles1);
  unpacked.pixel_values = full.pixel_values.narrow(0, 0, p01 + p2);
  unpacked.image_grid_thw = full.image_grid_thw;

  ModelInputs packed;  // one row: sample 0 then sample 1
  packed.input_ids = at::cat({full.input_ids[0], real1}).unsqueeze(0);
  packed.attention_mask = at::ones({1, n0 + n1}, at::kBool);
  packed.token_roles = at::cat({full.token_roles[0], roles1}).unsqueeze(0);
  packed.pixel_values = unpacked.pixel_values;
  packed.image_grid_thw = unpacked.image_grid_thw;
  auto layout = std::make_shared<SegmentLayout>();
  layout->rows = {{n0, n1}};
  packed.segments = layout;

  for (const char* which : {"dense", "gamma_shared", "pdrop"}) {
    const std::string w = which;
    std::shared_ptr<MultimodalLM> model;
    for (const auto& m : methods())
      if (w == m.name) model = converted(m.cfg);
    if (!model) model = load_pretrained(full_dir());
    model->train(true);
    at::NoGradGuard ng;
    ForwardState sa, sp;
    const auto a = model->forward(unpacked, sa).logits, p = model->forward(packed, sp).logits;
    const double e0 = (p[0].narrow(0, 0, n0) - a[0]).abs().max().item<double>();
    const double e1 = (p[0].narrow(0, n0, n1) - a[1].narrow(0, 0, n1)).abs().max().item<double>();
    EXPECT_LT(std::max(e0, e1), 1e-5) << w << ": packed against unpacked logits";
    if (w == "dense") continue;
    ASSERT_EQ(sa.tokens.size(), sp.tokens.size()) << w;
    for (size_t i = 0; i < sa.tokens.size(); ++i) {  // the same tokens skipped, per segment as per sample
      EXPECT_EQ(sa.tokens[i].processed, sp.tokens[i].processed) << w << " layer " << sa.tokens[i].layer;
      if (sp.tokens[i].layer == 1) {
        EXPECT_LT(sp.tokens[i].processed, sp.tokens[i].total) << w;
      }
    }
  }
}

// Greedy generation of rows 0 and 1 (right-padded, their images) against transformers' generate of each alone.
TEST(MRopeMoD, GreedyGenerateWithImagesMatchesTransformersGenerate) {
  auto model = load_pretrained(full_dir());
  SafetensorsFile ref(mod_ref());
  const ModelInputs p = right_padded_prompts(*model, batch(*model)).in;
  const int64_t T = ref.tensor("generate.row0").size(0);
  for (const bool cache : {true, false}) {
    GenerateOptions o;
    o.max_new_tokens = T;
    o.eos_token_id = -1;
    o.use_cache = cache;
    o.keep_logits = true;
    const auto res = generate(*model, p, o);
    for (int64_t b = 0; b < 2; ++b) {
      const auto want = ref.tensor("generate.row" + std::to_string(b));
      EXPECT_TRUE(res.tokens[b].equal(want)) << "row " << b << (cache ? " cached" : " recomputed") << ": "
                                             << res.tokens[b] << " vs " << want;
      const auto wl = ref.tensor("generate.row" + std::to_string(b) + ".logits");
      for (int64_t t = 0; t < T; ++t)
        EXPECT_LT((res.step_logits[t][b] - wl[t]).abs().max().item<double>(), 1e-5) << "row " << b << " step " << t;
    }
  }
}

// Continuous batching (DecodeBatch, `gmod serve`): row 1's image prompt joins while row 0's decodes two steps ahead;
// each decodes as transformers' generate of it alone (tokens and logits).
TEST(MRopeMoD, ImagePromptJoiningARunningBatchDecodesAsTransformersAlone) {
  auto model = load_pretrained(full_dir());
  auto full = batch(*model);
  SafetensorsFile ref(mod_ref());
  const auto patches = full.image_grid_thw.prod(1);
  const int64_t p01 = patches.narrow(0, 0, 2).sum().item<int64_t>(), p2 = patches[2].item<int64_t>();
  auto prompt = [&](int64_t b, int64_t first_patch, int64_t n_patches, int64_t first_grid, int64_t n_grids) {
    ModelInputs p;
    p.input_ids = full.input_ids[b].masked_select(full.attention_mask[b]).unsqueeze(0);
    p.attention_mask = at::ones_like(p.input_ids, at::kBool);
    p.pixel_values = full.pixel_values.narrow(0, first_patch, n_patches);
    p.image_grid_thw = full.image_grid_thw.narrow(0, first_grid, n_grids);
    return p;
  };
  const auto a = prompt(0, 0, p01, 0, 2), b = prompt(1, p01, p2, 2, 1);
  const auto want0 = ref.tensor("generate.row0.logits"), want1 = ref.tensor("generate.row1.logits");
  const int64_t T = want0.size(0);
  DecodeBatch batch(*model);
  at::NoGradGuard ng;
  auto logits = batch.admit(a, T).logits;  // [1, V]
  std::vector<std::vector<at::Tensor>> got(2);
  got[0].push_back(logits[0]);
  for (int t = 0; t < 2; ++t) {
    logits = batch.step(logits.argmax(-1));
    got[0].push_back(logits[0]);
  }
  const auto joined = batch.admit(b, T);
  ASSERT_EQ(joined.rows, std::vector<int64_t>{1});
  got[1].push_back(joined.logits[0]);
  auto next = at::stack({logits[0].argmax(), joined.logits[0].argmax()});
  while (static_cast<int64_t>(got[1].size()) < T) {
    logits = batch.step(next);
    if (static_cast<int64_t>(got[0].size()) < T) got[0].push_back(logits[0]);
    got[1].push_back(logits[1]);
    next = logits.argmax(-1);
  }
  for (int r = 0; r < 2; ++r) {
    const auto& want = r == 0 ? want0 : want1;
    for (size_t t = 0; t < got[r].size(); ++t)
      EXPECT_LT((got[r][t] - want[int64_t(t)]).abs().max().item<double>(), 1e-5) << "row " << r << " step " << t;
  }
}

// γ-MoD skipping in prefill and at decode (thresholds): cached generation equals one full forward of prompt +
// generated tokens with the routing replayed, the fed tokens at largest prompt id + 1, + 2, ... on all three axes.
TEST(MRopeMoD, CachedMoDDecodeEqualsReplayedFullForwardAt3DPositions) {
  MoDConfig cfg = methods().at(0).cfg;
  cfg.infer_threshold = 0.5;
  cfg.decode_threshold = 0.5;
  auto model = converted(cfg);
  model->eval();
  const auto prompts = right_padded_prompts(*model, batch(*model));
  const ModelInputs& p = prompts.in;
  const int64_t n0 = prompts.lengths[0], n1 = prompts.lengths[1], L = p.input_ids.size(1);

  auto layer = mod_layers(*model).at(0);
  layer->record_selection = true;
  GenerateOptions o;
  o.max_new_tokens = 6;
  o.eos_token_id = -1;
  o.keep_logits = true;
  const auto cached = generate(*model, p, o);
  const int64_t T = cached.tokens.size(1);
  ASSERT_EQ(static_cast<int64_t>(layer->recorded.size()), T);
  const auto prefill_skipped = (p.attention_mask & layer->recorded[0].logical_not()).sum().item<int64_t>();
  int64_t decode_skipped = 0;
  for (int64_t t = 1; t < T; ++t) decode_skipped += layer->recorded[t].logical_not().sum().item<int64_t>();
  EXPECT_GT(prefill_skipped, 0);
  EXPECT_GT(decode_skipped, 0);
  std::cout << "M-RoPE γ-MoD decode: " << prefill_skipped << " prompt tokens and " << decode_skipped
            << " decode tokens skipped\n";

  layer->forced_selection = at::cat(layer->recorded, 1);
  layer->record_selection = false;
  const auto m3 =
      mrope_positions(p.input_ids, p.attention_mask, p.image_grid_thw, {}, {}, *model->config.mrope).positions;
  const auto next = m3.amax(0).masked_fill(p.attention_mask.logical_not(), -1).amax(1) + 1;  // [2]
  auto fed = (next.unsqueeze(1) + at::arange(T - 1).unsqueeze(0)).unsqueeze(0).expand({3, 2, T - 1});
  ModelInputs f = p;
  f.input_ids = at::cat({p.input_ids, cached.tokens.narrow(1, 0, T - 1)}, 1);
  f.attention_mask = at::cat({p.attention_mask, at::ones({2, T - 1}, at::kBool)}, 1);
  f.positions = at::cat({m3, fed}, 2);
  const auto answer = at::full({2, T - 1}, static_cast<int64_t>(TokenRole::kAnswer)).to(at::kChar);
  f.token_roles = at::cat({p.token_roles, answer}, 1);
  at::NoGradGuard ng;
  const auto logits = model->forward(f).logits;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < 2; ++b) {
      const int64_t at_pos = t == 0 ? (b == 0 ? n0 : n1) - 1 : L + t - 1;
      EXPECT_LT((cached.step_logits[t][b] - logits[b][at_pos]).abs().max().item<double>(), 1e-4)
          << "step " << t << " row " << b;
    }
  layer->forced_selection = at::Tensor();
}

}  // namespace
}  // namespace gmod

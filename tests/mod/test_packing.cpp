// Packed rows (data.pack_to; model/segments.h) against the same samples unpacked, on the tiny LLaVA fixture's batch
// (a one-image sample, a two-image sample, a text-only sample, right padding) at random fp32 weights: the LM loss
// sum, the routing loss, each MoD layer's selection per sample and the gradient of every parameter agree, dense,
// γ-MoD, p-MoD, A-MoD, PyramidDrop and γ-MoD with activation checkpointing; FastV (inference only) refuses packed rows. Planted
// leaks turn the comparison red: one segment attending to the previous one, MoD capacity and top-k from the row's
// counts (positions not restarting are pinned in tests/data/test_pack.cpp: rotary attention cannot see a constant
// shift).
#include <gtest/gtest.h>

#include "data/pack.h"
#include "mod/conversion.h"
#include "mod/fastv.h"
#include "mod/pdrop.h"
#include "mod/pmod.h"
#include "model/activation_checkpoint.h"
#include "model/lm_loss.h"
#include "tests/mod/mod_test_util.h"

using namespace gmod;

namespace {

constexpr double kTol = 2e-5;  // fp32, relative to each tensor's largest magnitude

// The fixture batch packed first-fit-decreasing into rows of `budget` tokens, as collate_packed lays samples out.
// order[s] = the unpacked row of segment s (row-major).
struct Packed {
  ModelInputs in;
  std::vector<int64_t> order;
};

Packed pack_inputs(const ModelInputs& u, int64_t budget, int64_t image_id, int64_t image_seq) {
  const int64_t B = u.input_ids.size(0);
  std::vector<int64_t> len(static_cast<size_t>(B)), n_img(static_cast<size_t>(B)), first_img(static_cast<size_t>(B));
  int64_t img = 0;
  for (int64_t b = 0; b < B; ++b) {
    len[size_t(b)] = u.attention_mask[b].sum().item<int64_t>();
    n_img[size_t(b)] = (u.input_ids[b] == image_id).sum().item<int64_t>() / image_seq;
    first_img[size_t(b)] = img;
    img += n_img[size_t(b)];
  }
  const auto rows = pack_first_fit_decreasing(len, budget);
  auto layout = std::make_shared<SegmentLayout>();
  Packed p;
  int64_t L = 0;
  for (const auto& r : rows) {
    layout->rows.emplace_back();
    int64_t n = 0;
    for (size_t i : r) layout->rows.back().push_back(len[i]), n += len[i], p.order.push_back(int64_t(i));
    L = std::max(L, n);
  }
  const int64_t R = layout->num_rows();
  ModelInputs& in = p.in;
  in.input_ids = at::zeros({R, L}, at::kLong);
  in.labels = at::full({R, L}, -100, at::kLong);
  in.attention_mask = at::zeros({R, L}, at::kBool);
  in.token_roles = at::full({R, L}, static_cast<int64_t>(TokenRole::kPad), at::kChar);
  std::vector<at::Tensor> pix;
  size_t s = 0;
  for (int64_t r = 0; r < R; ++r) {
    int64_t start = 0;
    for (int64_t n : layout->rows[size_t(r)]) {
      const int64_t b = p.order[s++];
      in.input_ids[r].narrow(0, start, n).copy_(u.input_ids[b].narrow(0, 0, n));
      in.labels[r].narrow(0, start, n).copy_(u.labels[b].narrow(0, 0, n));
      in.labels[r][start] = -100;
      in.attention_mask[r].narrow(0, start, n).fill_(true);
      in.token_roles[r].narrow(0, start, n).copy_(u.token_roles[b].narrow(0, 0, n));
      for (int64_t k = 0; k < n_img[size_t(b)]; ++k) pix.push_back(u.pixel_values[first_img[size_t(b)] + k]);
      start += n;
    }
  }
  in.pixel_values = at::stack(pix);
  in.positions = layout->positions(L);
  in.segments = layout;
  return p;
}

struct Result {
  double lm_sum = 0, routing = 0;
  std::vector<at::Tensor> grads;
  std::vector<at::Tensor> selections;  // per MoD layer [B, L] (the layer's recorded selection)
};

Result run(MultimodalLM& m, const ModelInputs& in) {
  m.zero_grad();
  for (auto& l : mod_layers(m)) l->recorded.clear(), l->record_selection = true;
  ForwardState st;
  auto out = forward_label_loss(m, in, st);
  at::Tensor loss = out.lm_loss_sum;
  Result r;
  r.lm_sum = out.lm_loss_sum.item<double>();
  for (const auto& a : st.aux_losses) loss = loss + a, r.routing += a.item<double>();
  loss.backward();
  for (auto& p : m.parameters())
    r.grads.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
  for (auto& l : mod_layers(m)) r.selections.push_back(l->recorded.empty() ? at::Tensor() : l->recorded.front());
  return r;
}


// Largest relative difference between the unpacked and the packed run over loss, routing loss and gradients; the
// selections compared sample by sample (false when any differs).
struct Diff {
  double worst = 0;
  bool same_selection = true;
};

Diff compare(const Result& u, const Result& p, const ModelInputs& packed, const std::vector<int64_t>& order) {
  Diff d;
  d.worst = std::abs(u.lm_sum - p.lm_sum) / std::abs(u.lm_sum);
  if (u.routing != 0) d.worst = std::max(d.worst, std::abs(u.routing - p.routing) / std::abs(u.routing));
  // Gradients relative to the tensor's largest magnitude, floored at 1e-4 of the largest gradient of the model: a
  // gradient that is analytically zero (the key projection's bias: softmax ignores a constant per query row) holds
  // rounding noise only, which no relative comparison can hold to a tolerance.
  double top = 0;
  for (const auto& g : u.grads) top = std::max(top, g.abs().max().item<double>());
  for (size_t i = 0; i < u.grads.size(); ++i) {
    const double scale = std::max(u.grads[i].abs().max().item<double>(), 1e-4 * top);
    d.worst = std::max(d.worst, (p.grads[i] - u.grads[i]).abs().max().item<double>() / scale);
  }
  for (size_t l = 0; l < u.selections.size(); ++l) {
    size_t s = 0;
    for (int64_t r = 0; r < packed.segments->num_rows(); ++r) {
      int64_t start = 0;
      for (int64_t n : packed.segments->rows[size_t(r)]) {
        const int64_t b = order[s++];
        if (!u.selections[l][b].narrow(0, 0, n).equal(p.selections[l][r].narrow(0, start, n)))
          d.same_selection = false;
        start += n;
      }
    }
  }
  return d;
}

struct Setup {
  std::shared_ptr<MultimodalLM> model;
  ModelInputs unpacked;
  int64_t image_id, image_seq;
};

Setup setup(int layers) {
  Setup s;
  s.model = test::random_llava(layers, 17);
  s.model->train();
  s.unpacked = test::fixture_inputs();
  s.image_id = s.model->config.image_token_id;
  s.image_seq = s.model->config.image_seq_length();
  return s;
}

// Router weights at random values (p-MoD's routers start at zero, which ties every score).
void randomise_routers(MultimodalLM& m) {
  at::NoGradGuard ng;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(99);
  for (auto& item : m.named_parameters())
    if (item.key().find("router") != std::string::npos)
      item.value().copy_(at::randn(item.value().sizes(), gen, item.value().scalar_type()) * 0.5);
}

// The 4-layer model with γ-MoD on layers 1-3 (skip 0.5), routers at random values.
Setup gamma_mod_setup() {
  auto s = setup(4);
  MoDConfig c;
  c.router = RouterKind::kGammaShared;
  c.mod_layers = {1, 2, 3};
  c.skip_frac = 0.5;
  convert_to_mod(*s.model, c);
  s.model->train();
  randomise_routers(*s.model);
  return s;
}

void expect_packed_equals_unpacked(Setup& s, const char* what) {
  const Result u = run(*s.model, s.unpacked);
  for (int64_t budget : {64, 128}) {
    const Packed p = pack_inputs(s.unpacked, budget, s.image_id, s.image_seq);
    ASSERT_LT(p.in.segments->num_rows(), s.unpacked.input_ids.size(0)) << "the batch did not pack";
    const Diff d = compare(u, run(*s.model, p.in), p.in, p.order);
    EXPECT_LT(d.worst, kTol) << what << ", budget " << budget;
    EXPECT_TRUE(d.same_selection) << what << ", budget " << budget;
  }
}

}  // namespace

TEST(Packing, DenseLossAndEveryGradientMatchUnpacked) {
  auto s = setup(2);
  expect_packed_equals_unpacked(s, "dense");
}

TEST(Packing, GammaModRoutesEachSegmentAsItsSample) {
  auto s = gamma_mod_setup();
  expect_packed_equals_unpacked(s, "γ-MoD");
  // With activation checkpointing (the recompute replays the first pass's per-segment selection).
  s.model->llm->activation_checkpointing = parse_activation_checkpointing("full");
  expect_packed_equals_unpacked(s, "γ-MoD, activation checkpointing");
}

TEST(Packing, PModRoutesEachSegmentAsItsSample) {
  auto s = setup(4);
  MoDConfig c = pmod_config(4);
  convert_to_mod(*s.model, c);
  s.model->train();
  randomise_routers(*s.model);
  expect_packed_equals_unpacked(s, "p-MoD");
}

TEST(Packing, AModScoresAndRoutesEachSegmentAsItsSample) {
  auto s = setup(4);
  MoDConfig c;
  c.router = RouterKind::kAttention;
  c.mod_layers = {1, 3};
  c.skip_frac = 0.5;
  convert_to_mod(*s.model, c);
  s.model->train();
  expect_packed_equals_unpacked(s, "A-MoD");
}

TEST(Packing, PyramidDropRanksEachSegmentAsItsSample) {
  auto s = setup(4);
  convert_to_mod(*s.model, pdrop_config({1, 2, 3}, {0.5, 0.25, 0.125}, 4));
  s.model->train();
  expect_packed_equals_unpacked(s, "PyramidDrop");
}

TEST(Packing, FastVOnPackedRowsIsANamedError) {
  auto s = setup(4);
  convert_to_mod(*s.model, fastv_config(2, 0.5, 4));
  const Packed p = pack_inputs(s.unpacked, 128, s.image_id, s.image_seq);
  ForwardState st;
  try {
    forward_label_loss(*s.model, p.in, st);
    FAIL() << "FastV ran on packed rows";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("packed rows (data.pack_to)"), std::string::npos) << e.what();
  }
}

// Each planted leak must turn the comparison red: the same check as above, on a deliberately wrong packed input.
TEST(Packing, PlantedLeaksTurnTheComparisonRed) {
  auto s = gamma_mod_setup();
  const Result u = run(*s.model, s.unpacked);
  const Packed good = pack_inputs(s.unpacked, 128, s.image_id, s.image_seq);
  ASSERT_EQ(good.in.segments->num_rows(), 1);
  {
    const Diff d = compare(u, run(*s.model, good.in), good.in, good.order);
    ASSERT_LT(d.worst, kTol);
    ASSERT_TRUE(d.same_selection);
  }
  {  // one segment attending to the previous one: a single segment per row for attention (and routing)
    Packed leak = good;
    auto merged = std::make_shared<SegmentLayout>();
    merged->rows = {{good.in.segments->row_length(0)}};
    leak.in.segments = merged;
    leak.in.positions = good.in.positions;  // positions still restart: only the attention/routing leak
    const Diff d = compare(u, run(*s.model, leak.in), good.in, good.order);
    EXPECT_GT(d.worst, 100 * kTol) << "cross-segment attention went unnoticed";
  }
  // Positions continuing over the row instead of restarting shift each segment's positions by a constant, which
  // rotary attention cannot see (it depends on position differences only): the loss and gradients change by rounding
  // alone, so that leak is pinned where positions are made (tests/data/test_pack.cpp, SegmentLayout::positions).
  {  // capacity and top-k over the row: routing sees one sample per row, attention still per segment
    for (auto& l : mod_layers(*s.model)) l->cfg.skip_frac = 0.5;
    Packed leak = good;
    const auto per_row = count_routing_roles(good.in.token_roles, good.in.attention_mask, 1,
                                             good.in.input_ids.size(1));
    // The row's counts spread over its segments the wrong way: all of the row's routable tokens on segment 0.
    auto wrong = count_segment_roles(good.in.token_roles, good.in.attention_mask, 1, good.in.input_ids.size(1),
                                     *good.in.segments);
    wrong[0][1] = per_row[0][1];
    leak.in.host_role_counts = wrong;
    const Diff d = compare(u, run(*s.model, leak.in), good.in, good.order);
    EXPECT_FALSE(d.same_selection && d.worst < kTol) << "a capacity over the row went unnoticed";
  }
}

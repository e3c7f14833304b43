// MoD on CUDA against the CPU reference (run by bench/gpu_check.sh on a GPU machine; skipped without a CUDA
// device): the attention log-sum-exp that CUDA's fused kernels hand to A-MoD scoring (memory-efficient kernel
// in fp32, flash in bf16) equals the explicit computation, and a γ-MoD and an A-MoD model's training forward
// + backward on CUDA (ragged kept counts through the fused causal kernel) give the CPU's loss, logits,
// routing and gradients; batch copies to the device are pinned and non-blocking.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "data/batch.h"
#include "mod/conversion.h"
#include "mod/host_sync_counter.h"
#include "mod/router.h"
#include "model/layers.h"
#include "tests/mod/mod_test_util.h"

using namespace gmod;

namespace {

ModelInputs to_device(ModelInputs in, const at::Device& d) {
  for (at::Tensor* t :
       {&in.input_ids, &in.pixel_values, &in.attention_mask, &in.labels, &in.positions, &in.token_roles})
    if (t->defined()) *t = t->to(d);
  return in;  // host_role_counts stays on the host, as the data pipeline hands it over
}

double max_rel(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(at::kCPU, at::kDouble), y = b.to(at::kCPU, at::kDouble);
  return ((x - y).abs().max() / y.abs().max().clamp_min(1e-30)).item<double>();
}

}  // namespace

TEST(MoDCuda, FusedKernelLogSumExpGivesTheExplicitAModScores) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  const int64_t B = 2, H = 4, L = 37, Dh = 16;
  auto q = at::randn({B, H, L, Dh}, gen), k = at::randn({B, H, L, Dh}, gen),
       v = at::randn({B, H, L, Dh}, gen);
  auto valid = at::ones({B, L}, at::kBool);
  valid[1].narrow(0, 29, 8).fill_(false);
  const double scale = 1.0 / std::sqrt(double(Dh));
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    const auto o = at::TensorOptions().device(at::kCUDA).dtype(dt);
    // The reference on the CPU in fp32 from the same (rounded) inputs.
    const at::Tensor qr = q.to(dt).to(at::kFloat), kr = k.to(dt).to(at::kFloat), vr = v.to(dt).to(at::kFloat);
    auto probs =
        explicit_attention(qr, kr, vr, AttentionMask::causal(valid, L, L, 0).allowed, true, scale).second;
    // What AttentionImpl::forward asks for on CUDA: the fused kernel with its lse (mem-efficient fp32, flash
    // bf16).
    at::Tensor lse = dt == at::kFloat ? std::get<1>(at::_scaled_dot_product_efficient_attention(
                                            q.to(o), k.to(o), v.to(o), std::nullopt, true, 0.0, true, scale))
                                      : std::get<1>(at::_scaled_dot_product_flash_attention(
                                            q.to(o), k.to(o), v.to(o), 0.0, true, false, scale));
    lse = lse.narrow(2, 0, L).to(at::kFloat);
    const double tol = dt == at::kFloat ? 1e-4 : 3e-2;
    for (bool cn : {false, true}) {
      auto ref = attention_column_scores_from_probs(probs, valid, cn);
      auto got = attention_column_scores(q.to(o), k.to(o), valid.cuda(), cn, 16, lse);
      EXPECT_LT(max_rel(got, ref), tol) << "dtype " << dt << " causal_normalise " << cn;
    }
  }
}

namespace {

// The smallest gap, over the samples of every recorded top-k, between the lowest key a selection kept and the
// highest it skipped (topk_key: forced +inf, not routable -inf), relative to max(1, |kept key|); +inf when nothing
// routable was skipped.
double min_capacity_margin(const std::vector<std::shared_ptr<MoDDecoderLayer>>& layers) {
  double margin = std::numeric_limits<double>::infinity();
  for (const auto& l : layers)
    for (size_t i = 0; i < l->recorded_keys.size(); ++i) {
      const at::Tensor key = l->recorded_keys[i].cpu(), sel = l->recorded.at(i).cpu();
      const auto kept = at::where(sel, key, at::full_like(key, INFINITY)).amin(1);      // [B]
      const auto skipped = at::where(sel, at::full_like(key, -INFINITY), key).amax(1);  // [B]
      for (int64_t b = 0; b < key.size(0); ++b) {
        const double k = kept[b].item<double>(), s = skipped[b].item<double>();
        if (std::isinf(s) && s < 0) continue;  // no routable token skipped in this sample
        margin = std::min(margin, k == s ? 0.0 : (k - s) / std::max(1.0, std::abs(k)));  // +inf ties: 0
      }
    }
  return margin;
}

}  // namespace

TEST(MoDCuda, GammaAndAModTrainingStepMatchesCpu) {
  // Ragged lengths so that the kept counts differ per sample (B x k_max rows through the fused kernel).
  ModelInputs in = test::text_inputs({24, 17, 11}, 24, 14, 3);
  in.labels = in.input_ids.masked_fill(in.attention_mask.logical_not(), -100);
  // CUDA's router scores differ from the CPU's within fp32 rounding (another summation order in the matmuls and
  // the attention that feed them), and the tokens kept are a top-k of those scores: a correct build could keep
  // another token wherever the last kept and the first skipped score lie within that rounding, and the logits
  // and gradients below would then differ by far more than their tolerances. So the selections are compared,
  // and the outputs with them, only because this seed's margins at the capacity boundary are checked here
  // (on the CPU, so also without a device) to exceed kMargin, 1e-4 relative: the tolerance the logits get below
  // (fp32, CUDA vs CPU), which bounds what the scores computed from the same hidden states may differ by. A change
  // of seed, shapes or initialisation that puts a near-tie there fails this check, not the CUDA comparison.
  constexpr double kMargin = 1e-4;
  for (RouterKind kind : {RouterKind::kGammaShared, RouterKind::kAttention}) {
    const std::string what = kind == RouterKind::kGammaShared ? "γ-MoD" : "A-MoD";
    MoDConfig mc;
    mc.router = kind;
    // A-MoD interleaves MoD and dense layers (each routes by the previous dense layer's attention map).
    mc.mod_layers = kind == RouterKind::kGammaShared ? std::vector<int>{1, 2} : std::vector<int>{1, 3};
    mc.mode = RoutingMode::kTopK;
    std::shared_ptr<MultimodalLM> cpu = test::random_text_lm(4, 11), gpu = test::random_text_lm(4, 11);
    convert_to_mod(*cpu, mc);
    convert_to_mod(*gpu, mc);
    for (const auto& m : {cpu, gpu})
      for (auto& l : mod_layers(*m)) l->record_selection = true;
    cpu->train();
    ForwardState sc;
    auto oc = cpu->forward(in, sc);
    const auto cpu_layers = mod_layers(*cpu);
    ASSERT_EQ(cpu_layers.size(), 2u) << what;
    for (const auto& l : cpu_layers) ASSERT_EQ(l->recorded_keys.size(), 1u) << what << ": one top-k per forward";
    const double margin = min_capacity_margin(cpu_layers);
    ASSERT_GT(margin, kMargin) << what << ": a near-tie at the capacity boundary (relative gap " << margin
                               << "): the CUDA selection may differ in a correct build; pick another seed";
    if (!at::hasCUDA()) continue;  // both kinds' margins are checked without a device
    gpu->to(at::Device(at::kCUDA));
    gpu->train();
    ForwardState sg;
    auto og = gpu->forward(to_device(in, at::Device(at::kCUDA)), sg);
    EXPECT_LT(max_rel(og.lm_loss, oc.lm_loss), 1e-5) << what;
    EXPECT_LT(test::max_abs_valid(og.logits.cpu(), oc.logits, in.attention_mask), 1e-4) << what;
    const auto gpu_layers = mod_layers(*gpu);
    ASSERT_EQ(gpu_layers.size(), cpu_layers.size()) << what;
    for (size_t i = 0; i < cpu_layers.size(); ++i)
      EXPECT_TRUE(gpu_layers[i]->recorded.at(0).cpu().equal(cpu_layers[i]->recorded.at(0)))
          << what << " MoD layer " << i << ": CUDA kept other tokens than the CPU";
    // The counts follow from the roles alone (host capacities), so they are equal whatever the scores.
    ASSERT_EQ(sg.tokens.size(), sc.tokens.size()) << what;
    for (size_t i = 0; i < sc.tokens.size(); ++i) {
      EXPECT_EQ(sg.tokens[i].processed, sc.tokens[i].processed) << what << " layer " << sc.tokens[i].layer;
      EXPECT_EQ(sg.tokens[i].attn_pairs, sc.tokens[i].attn_pairs) << what << " layer " << sc.tokens[i].layer;
    }
    at::Tensor lc = oc.lm_loss, lg = og.lm_loss;
    for (const auto& a : sc.aux_losses) lc = lc + a;
    for (const auto& a : sg.aux_losses) lg = lg + a;
    lc.backward();
    lg.backward();
    auto pc = cpu->named_parameters(true), pg = gpu->named_parameters(true);
    for (const auto& p : pc) {
      const at::Tensor* g = pg.find(p.key());
      ASSERT_NE(g, nullptr) << p.key();
      if (!p.value().grad().defined()) {
        EXPECT_FALSE(g->grad().defined()) << what << " " << p.key();
        continue;
      }
      ASSERT_TRUE(g->grad().defined()) << what << " " << p.key();
      EXPECT_LT(max_rel(g->grad(), p.value().grad()), 1e-3) << what << " gradient of " << p.key();
    }
  }
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device (the CPU's capacity margins were checked)";
}

// Host -> device batch copies: pinned and non-blocking (data/batch.h to_model_inputs), so the host sync
// counter sees none; a pageable copy is a blocking one and is counted.
TEST(MoDCuda, PinnedBatchCopiesDoNotBlockTheHost) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  Batch b;
  b.input_ids = at::randint(3, 64, {2, 16}, at::kLong);
  b.labels = b.input_ids.clone();
  b.attention_mask = at::ones({2, 16}, at::kBool);
  b.token_roles = at::full({2, 16}, static_cast<int64_t>(TokenRole::kAnswer), at::kChar);
  {
    HostSyncCounter c;
    (void)b.input_ids.to(at::kCUDA);  // pageable and blocking
    EXPECT_EQ(c.counts().host_to_device, 1) << c.counts().to_string();
  }
  HostSyncCounter c;
  ModelInputs in = to_model_inputs(b, at::Device(at::kCUDA));
  EXPECT_EQ(c.counts().host_to_device, 0) << c.counts().to_string();
  EXPECT_TRUE(in.input_ids.is_cuda());
  EXPECT_TRUE(at::equal(in.labels.cpu(), b.labels));
}

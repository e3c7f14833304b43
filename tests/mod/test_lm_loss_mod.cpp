// The label-only chunked LM loss (model/lm_loss.h) on γ-MoD models: the same LM loss, routing losses and
// gradients (shared router included) as the full-logits path MultimodalLM::forward, with images, padding
// and token roles from the tiny LLaVA fixture.
#include <gtest/gtest.h>

#include <map>

#include "mod/conversion.h"
#include "mod/mod_layer.h"
#include "model/lm_loss.h"
#include "tests/mod/mod_test_util.h"

using namespace gmod;

namespace {

struct Outcome {
  double lm = 0, routing = 0;
  std::map<std::string, at::Tensor> grads;
};

Outcome run(MultimodalLM& m, const ModelInputs& in, const MoDConfig& mc, int64_t chunk) {
  m.zero_grad();
  ForwardState st;
  ModelOutput out = chunk < 0 ? m.forward(in, st) : forward_label_loss(m, in, st, chunk);
  EXPECT_FALSE(st.aux_losses.empty()) << "the MoD layers routed";
  at::Tensor routing = total_routing_loss(st, mc);
  (out.lm_loss_sum / 7.0 + routing).backward();
  Outcome r;
  r.lm = out.lm_loss_sum.item<double>();
  r.routing = routing.item<double>();
  for (const auto& p : m.named_parameters())
    if (p.value().grad().defined()) r.grads[p.key()] = p.value().grad().clone();
  return r;
}

}  // namespace

TEST(LabelOnlyLmLossMoD, GammaModSharedRouterMatchesFullLogits) {
  for (bool tied : {false, true}) {
    auto m = test::random_llava(3, 31);
    if (tied) {  // tie the head to the embeddings as a tied checkpoint would
      auto cfg = m->config;
      cfg.text.tie_word_embeddings = true;
      m = std::make_shared<MultimodalLM>(cfg);
      m->init_weights(31);
    }
    MoDConfig mc;
    mc.mod_layers = {1, 2};
    mc.skip_frac = 0.5;
    convert_to_mod(*m, mc);
    m->train();
    const ModelInputs in = test::fixture_inputs();
    const Outcome want = run(*m, in, mc, -1);
    bool router_grad = false;
    for (const auto& [name, g] : want.grads) router_grad |= name.rfind("mod_router.", 0) == 0;
    ASSERT_TRUE(router_grad) << "the shared router is trained";
    for (int64_t chunk : {3, 0}) {
      const Outcome got = run(*m, in, mc, chunk);
      const std::string what = std::string(tied ? "tied" : "untied") + ", chunk " + std::to_string(chunk);
      EXPECT_NEAR(got.lm, want.lm, 1e-5 * std::abs(want.lm)) << what;
      EXPECT_EQ(got.routing, want.routing) << what << ": routing is upstream of the head";
      ASSERT_EQ(got.grads.size(), want.grads.size()) << what;
      for (const auto& [name, g] : want.grads) {
        const double ref = std::max(g.abs().max().item<double>(), 1e-6);
        EXPECT_LE((got.grads.at(name) - g).abs().max().item<double>(), 2e-5 * ref) << what << ": " << name;
      }
    }
  }
}

// gmod's γ-MoD layer against an independent Python oracle (tests/fixtures/make_mod_oracle.py, written from the
// official code's equations: shared router on ln_in(h), top-k with forced keep, compacted causal attention,
// MLP-only scaling by p, 2-class routing CE): output, selection, routing loss and the gradients of
// J = sum(out * R) + routing loss with respect to the router and h, all within 1e-5.
//   "gmod" case: a ragged, right-padded batch. The oracle implements gmod's documented choices where gmod
//                deliberately differs from the official code: per-sample capacity from the roles (the code uses
//                ceil(L - 0.5 R) with the padded L and one R), padding never processed, loss averaged over valid
//                tokens (the code: all B*L positions, padding with target 1).
//   "official" case: no padding and one routable prefix, where the official formulas (k = ceil(L - 0.5 R), the
//                0/1 forced-keep bias, loss over all B*L) are computed literally; gmod's defaults reproduce them.
#include <gtest/gtest.h>

#include "mod/conversion.h"
#include "tests/mod/mod_test_util.h"

using namespace gmod;

namespace {

class ModOracle : public ::testing::TestWithParam<std::string> {};

TEST_P(ModOracle, OutputRouterGradientAndRoutingLossMatch) {
  SafetensorsFile f(test::fixture("mod_oracle/" + GetParam() + ".safetensors"));
  auto cv = f.tensor("config").to(at::kLong);
  LlavaConfig c;
  c.text.hidden_size = static_cast<int>(cv[0].item<int64_t>());
  c.text.num_attention_heads = static_cast<int>(cv[1].item<int64_t>());
  c.text.num_key_value_heads = static_cast<int>(cv[2].item<int64_t>());
  c.text.intermediate_size = static_cast<int>(cv[3].item<int64_t>());
  c.text.num_hidden_layers = 1;
  c.text.vocab_size = 16;
  c.text.rms_norm_eps = 1e-5;
  c.text.rope_theta = 10000.0;
  auto model = std::make_shared<MultimodalLM>(c);
  model->init_weights(0);
  {
    at::NoGradGuard ng;
    auto params = model->named_parameters();
    const std::vector<std::pair<std::string, std::string>> names = {
        {"ln_in", "input_layernorm.weight"},    {"ln_post", "post_attention_layernorm.weight"},
        {"q", "self_attn.q_proj.weight"},       {"k", "self_attn.k_proj.weight"},
        {"v", "self_attn.v_proj.weight"},       {"o", "self_attn.o_proj.weight"},
        {"gate", "mlp.gate_proj.weight"},       {"up", "mlp.up_proj.weight"},
        {"down", "mlp.down_proj.weight"}};
    for (const auto& [k, n] : names) params["llm.layers.0." + n].copy_(f.tensor("weight." + k));
  }
  MoDConfig cfg;  // gmod's defaults: γ-MoD shared router, forced keep = questions + answers, compacted RoPE
  cfg.mod_layers = {0};
  cfg.skip_frac = 0.5;
  cfg.mode = RoutingMode::kTopK;
  cfg.router_aux_loss_coef = 1.0;
  convert_to_mod(*model, cfg);
  auto router = shared_router(*model);
  ASSERT_TRUE(router);
  {
    at::NoGradGuard ng;
    router->weight.copy_(f.tensor("weight.router"));
  }
  auto layer = mod_layers(*model)[0];
  layer->record_selection = true;

  const auto roles = f.tensor("input.roles").to(at::kChar);
  const int64_t B = roles.size(0), L = roles.size(1);
  ModelInputs in;
  in.input_ids = at::zeros({B, L}, at::kLong);
  in.attention_mask = roles != static_cast<int64_t>(TokenRole::kPad);
  in.token_roles = roles;
  ForwardState st;
  prepare_forward_state(st, in.input_ids, in.attention_mask, in.positions);
  st.token_roles = in.token_roles;
  st.rope = &model->llm->rope;
  std::tie(st.cos, st.sin) = model->llm->rope.cos_sin(st.positions, at::kFloat);

  auto h = f.tensor("input.h").clone().set_requires_grad(true);
  auto out = layer->forward(h, st, 0);
  ASSERT_EQ(st.aux_losses.size(), 1u);
  const auto loss = st.aux_losses[0];

  ASSERT_EQ(layer->recorded.size(), 1u);
  EXPECT_TRUE(at::equal(layer->recorded[0], f.tensor("output.selection").to(at::kBool))) << "selected tokens";
  const auto cap = f.tensor("output.capacity").to(at::kLong);
  EXPECT_TRUE(at::equal(layer->recorded[0].sum(1), cap)) << "per-sample capacity";
  EXPECT_LT((out - f.tensor("output.out")).abs().max().item<double>(), 1e-5) << "layer output";
  EXPECT_NEAR(loss.item<double>(), f.tensor("output.routing_loss").item<double>(), 1e-5) << "routing loss";

  auto J = (out * f.tensor("input.R") * in.attention_mask.unsqueeze(-1)).sum() + total_routing_loss(st, cfg);
  J.backward();
  const auto gr = f.tensor("grad.router"), gh = f.tensor("grad.h");
  ASSERT_TRUE(router->weight.grad().defined());
  EXPECT_LT((router->weight.grad() - gr).abs().max().item<double>(), 1e-5 * std::max(1.0, gr.abs().max().item<double>()))
      << "router gradient";
  EXPECT_LT((h.grad() - gh).abs().max().item<double>(), 1e-5 * std::max(1.0, gh.abs().max().item<double>()))
      << "input gradient";
  EXPECT_GT(gr.norm().item<double>(), 1e-3);  // the router gets gradient (routing CE and the p-scaled MLP delta)
}

INSTANTIATE_TEST_SUITE_P(Cases, ModOracle, ::testing::Values("gmod", "official"),
                         [](const auto& i) { return i.param; });

}  // namespace

// PyramidDrop (mod/pdrop.h) without the original: its config (parsing, validation errors naming the option and
// value, the JSON round trip, the trainer's rule, the planned kept shares), the last-instruction-token queries, the
// error for a sample with no instruction token, training under activation checkpointing (the stage state replayed)
// against the plain forward, bitwise, and the host synchronisations a stage boundary costs, on the parity
// fixture's model (tests/fixtures/pdrop).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "mod/conversion.h"
#include "mod/host_sync_counter.h"
#include "mod/pdrop.h"
#include "model/activation_checkpoint.h"
#include "model/llava.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "model/token_roles.h"
#include "tests/common/error_of.h"
#include "tests/common/paths.h"

using gmod::test::error_of;

using namespace gmod;

namespace {

std::vector<int64_t> positions(const at::Tensor& row) {
  const auto t = row.nonzero().view(-1).to(at::kLong).contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

ModelInputs fixture_inputs(const std::string& tag, int64_t image_id) {
  SafetensorsFile ref(test::fixture("pdrop/reference.safetensors"));
  ModelInputs in;
  auto ids = ref.tensor(tag + ".input.input_ids");
  in.input_ids = ids.masked_fill(ids == -200, image_id);
  in.token_roles = ref.tensor(tag + ".input.token_roles").to(at::kChar);
  if (ref.has(tag + ".input.labels")) in.labels = ref.tensor(tag + ".input.labels").clone();
  if (ref.has(tag + ".input.attention_mask"))
    in.attention_mask = ref.tensor(tag + ".input.attention_mask").to(at::kBool);
  in.pixel_values = ref.tensor(tag + ".input.pixels").clone();
  return in;
}

}  // namespace

TEST(PDropConfig, ParsesTheOfficialSetting) {
  const auto c = parse_pdrop("8,16,24:0.5,0.25,0.125", 32);
  EXPECT_EQ(c.router, RouterKind::kPDrop);
  EXPECT_EQ(c.pdrop_layers, (std::vector<int>{8, 16, 24}));
  EXPECT_EQ(c.pdrop_ratios, (std::vector<double>{0.5, 0.25, 0.125}));
  ASSERT_EQ(c.mod_layers.size(), 24u);
  EXPECT_EQ(c.mod_layers.front(), 8);
  EXPECT_EQ(c.mod_layers.back(), 31);
  EXPECT_EQ(c.rope_positions, RopePositions::kCompacted);
  EXPECT_EQ(c.pdrop_unanswered, PDropUnanswered::kLastToken);
  EXPECT_EQ(pdrop_boundary(c, 8), 1);
  EXPECT_EQ(pdrop_boundary(c, 24), 3);
  EXPECT_EQ(pdrop_boundary(c, 9), 0);
  EXPECT_EQ(pdrop_ratio(c, 7), 1.0);
  EXPECT_EQ(pdrop_ratio(c, 8), 0.5);
  EXPECT_EQ(pdrop_ratio(c, 23), 0.25);
  EXPECT_EQ(pdrop_ratio(c, 31), 0.125);
  EXPECT_EQ(pdrop_kept_images(576, 0.5), 288);
  EXPECT_EQ(pdrop_kept_images(576, 0.125), 72);
  EXPECT_EQ(pdrop_kept_images(64, 0.3), 19);  // int(19.2): truncation, as the original's int()
  EXPECT_EQ(pdrop_kept_images(7, 0.0), 0);
}

TEST(PDropConfig, BadValuesAreNamedErrors) {
  EXPECT_NE(error_of([] { parse_pdrop("8,16", 32); }).find("expected LAYERS:RATIOS"), std::string::npos);
  EXPECT_NE(error_of([] { parse_pdrop("8,x:0.5,0.25", 32); }).find("\"8,x:0.5,0.25\""), std::string::npos);
  EXPECT_NE(error_of([] { parse_pdrop("8,16:0.5", 32); }).find("one ratio per stage"), std::string::npos);
  EXPECT_NE(error_of([] { parse_pdrop("0,16:0.5,0.25", 32); }).find("pdrop_layers[0] = 0 outside [1, 32)"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_pdrop("8,32:0.5,0.25", 32); }).find("pdrop_layers[1] = 32"), std::string::npos);
  EXPECT_NE(error_of([] { parse_pdrop("16,8:0.5,0.25", 32); }).find("strictly increasing"), std::string::npos);
  EXPECT_NE(error_of([] { parse_pdrop("8,16:0.25,0.5", 32); }).find("pdrop_ratios[1] = 0.5 is above"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_pdrop("8:1.5", 32); }).find("pdrop_ratios[0] = 1.5, expected [0, 1]"),
            std::string::npos);
  // mod_layers must be the tail from the first stage on.
  auto c = parse_pdrop("8,16:0.5,0.25", 32);
  c.mod_layers.pop_back();
  EXPECT_NE(error_of([&] { validate(c, 32, "test"); }).find("every layer from pdrop_layers[0] = 8"),
            std::string::npos);
  nlohmann::json j = {{"router", "pdrop"}, {"pdrop_unanswered", "sometimes"}};
  EXPECT_NE(error_of([&] { mod_config_from_json(j, "cfg"); }).find("pdrop_unanswered = \"sometimes\""),
            std::string::npos);
}

TEST(PDropConfig, RoundTripsAndTheTrainersRule) {
  auto c = parse_pdrop("2,4:0.5,0.25", 6);
  c.pdrop_unanswered = PDropUnanswered::kKeepAll;
  const auto back = mod_config_from_json(to_json(c), "round trip");
  EXPECT_EQ(back.router, RouterKind::kPDrop);
  EXPECT_EQ(back.pdrop_layers, c.pdrop_layers);
  EXPECT_EQ(back.pdrop_ratios, c.pdrop_ratios);
  EXPECT_EQ(back.pdrop_unanswered, PDropUnanswered::kKeepAll);
  EXPECT_EQ(back.mod_layers, c.mod_layers);
  EXPECT_EQ(back.router_aux_loss_coef, 0.0);
  EXPECT_NO_THROW(validate(back, 6, "round trip"));

  EXPECT_FALSE(rule_needs_arank("pdrop:2,4:0.5,0.25"));
  MoDConfig base;
  base.router = RouterKind::kPDrop;
  base.pdrop_unanswered = PDropUnanswered::kKeepAll;
  const auto r = config_for_rule("pdrop:2,4:0.5,0.25", base, 6);
  EXPECT_EQ(r.mod_layers, (std::vector<int>{2, 3, 4, 5}));
  EXPECT_EQ(r.pdrop_unanswered, PDropUnanswered::kKeepAll);
  // mod.config with router pdrop and its stages, no layer list: the layers follow from the stages.
  base.pdrop_layers = {3};
  base.pdrop_ratios = {0.5};
  EXPECT_EQ(config_for_rule("arank_mod", base, 6).mod_layers, (std::vector<int>{3, 4, 5}));
  EXPECT_NE(error_of([] { config_for_rule("pdrop:2,9:0.5,0.25", MoDConfig{}, 6); }).find("pdrop_layers[1] = 9"),
            std::string::npos);
  // The plan's kept shares: 1 - (1 - ratio)·routable per MoD layer.
  const auto kept = planned_kept_fractions(r, 6, 0.5);
  ASSERT_EQ(kept.size(), 4u);
  EXPECT_DOUBLE_EQ(kept[0], 0.75);
  EXPECT_DOUBLE_EQ(kept[1], 0.75);
  EXPECT_DOUBLE_EQ(kept[2], 0.625);
  EXPECT_DOUBLE_EQ(kept[3], 0.625);
}

TEST(PDropQueries, TheTokenBeforeEachAnswerSpanElseTheLastToken) {
  const auto S = int8_t(TokenRole::kSystem), I = int8_t(TokenRole::kImage), Q = int8_t(TokenRole::kQuestion),
             A = int8_t(TokenRole::kAnswer), P = int8_t(TokenRole::kPad);
  auto roles = at::tensor(std::vector<int8_t>{S, I, I, Q, Q, A, A, Q, A, P,  //
                                              S, I, I, Q, Q, Q, P, P, P, P},
                          at::kChar)
                   .view({2, 10})
                   .to(at::kLong);
  auto valid = roles != int64_t(P);
  at::Tensor has;
  auto q = pdrop_queries(roles, valid, false, &has);
  EXPECT_EQ(positions(q[0]), (std::vector<int64_t>{4, 7}));
  EXPECT_EQ(positions(q[1]), (std::vector<int64_t>{5}));
  EXPECT_TRUE(has.all().item<bool>());
  // keep_unanswered (the original's training fallback): the unanswered sample has no query.
  q = pdrop_queries(roles, valid, true, &has);
  EXPECT_EQ(q[1].sum().item<int64_t>(), 0);
  EXPECT_FALSE(has[1].item<bool>());
  EXPECT_TRUE(has[0].item<bool>());
}

TEST(PDropModel, NoInstructionTokenIsANamedError) {
  // A prompt that ends with its image: the last prompt token, PyramidDrop's query, is an image token.
  auto m = load_pretrained(test::fixture("pdrop"));
  convert_to_mod(*m, parse_pdrop("2,4,5:0.5,0.25,0.125", m->config.text.num_hidden_layers));
  m->eval();
  auto in = fixture_inputs("infer", m->config.image_token_id);
  const auto image = (in.token_roles[0] == int64_t(TokenRole::kImage)).nonzero().view(-1);
  const int64_t end = image[-1].item<int64_t>() + 1;
  in.input_ids = in.input_ids.narrow(1, 0, end).contiguous();
  in.token_roles = in.token_roles.narrow(1, 0, end).contiguous();
  at::NoGradGuard ng;
  const auto err = error_of([&] { m->forward(in); });
  EXPECT_NE(err.find("PyramidDrop layer 2: sample 0 has no instruction token"), std::string::npos) << err;
}

TEST(PDropModel, ActivationCheckpointingReplaysTheStagesExactly) {
  auto plain = load_pretrained(test::fixture("pdrop"));
  auto ckpt = load_pretrained(test::fixture("pdrop"));
  const auto c = parse_pdrop("2,4,5:0.5,0.25,0.125", plain->config.text.num_hidden_layers);
  convert_to_mod(*plain, c);
  convert_to_mod(*ckpt, c);
  ckpt->llm->activation_checkpointing = parse_activation_checkpointing("full");
  const auto in = fixture_inputs("train", plain->config.image_token_id);
  plain->train();
  ckpt->train();
  auto a = plain->forward(in);
  auto b = ckpt->forward(in);
  a.lm_loss.backward();
  b.lm_loss.backward();
  EXPECT_TRUE(at::equal(a.logits, b.logits));
  auto pa = plain->named_parameters(), pb = ckpt->named_parameters();
  int compared = 0;
  for (const auto& p : pa) {
    const auto& ga = p.value().grad();
    const auto& gb = pb[p.key()].grad();
    ASSERT_EQ(ga.defined(), gb.defined()) << p.key();
    if (!ga.defined()) continue;
    EXPECT_TRUE(at::equal(ga, gb)) << p.key();
    ++compared;
  }
  EXPECT_GT(compared, 50);
}

// A stage boundary ranks with two host synchronisations (the image and present counts, then the query counts): the
// same four PyramidDrop layers (2-5) with three boundaries cost exactly 4 more than with one (counted as on a GPU,
// mod/host_sync_counter.h). The selection is unchanged by the counting (the parity tests pin it).
TEST(PDropModel, EachStageBoundaryCostsTwoHostSyncs) {
  auto syncs = [](const std::string& spec) {
    auto m = load_pretrained(test::fixture("pdrop"));
    convert_to_mod(*m, parse_pdrop(spec, m->config.text.num_hidden_layers));
    m->train();
    const auto in = fixture_inputs("train", m->config.image_token_id);
    HostSyncCounter counter;
    m->forward(in);
    return counter.counts();
  };
  const auto one = syncs("2:0.5"), three = syncs("2,4,5:0.5,0.25,0.125");
  EXPECT_EQ(three.total() - one.total(), 2 * 2) << "3 boundaries: " << three.to_string() << "; 1: " << one.to_string();
}

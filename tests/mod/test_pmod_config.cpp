// p-MoD's config keys (mod/pmod.h): round trip through JSON, p-MoD's defaults, and named errors for bad values,
// a mod_layers_idx the schedule does not give and original configs gmod does not implement.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "mod/conversion.h"
#include "mod/pmod.h"
#include "tests/common/error_of.h"

using gmod::test::invalid_argument_of;

using namespace gmod;

namespace {

TEST(PModConfig, RoundTripsAndTakesPModDefaults) {
  const MoDConfig c = pmod_config(32);
  EXPECT_EQ(c.mod_layers.front(), 8);
  EXPECT_EQ(c.mod_layers.back(), 31);
  const auto j = to_json(c);
  const MoDConfig r = mod_config_from_json(j, "round trip");
  EXPECT_EQ(r.router, RouterKind::kPMoD);
  EXPECT_EQ(r.mod_layers, c.mod_layers);
  EXPECT_EQ(to_json(r), j);
  // Only the router named: rope positions original, zero router init, no routing loss.
  const MoDConfig d = mod_config_from_json({{"router", "pmod"}, {"mod_layers_idx", c.mod_layers}}, "mod.config");
  EXPECT_EQ(d.rope_positions, RopePositions::kOriginal);
  EXPECT_EQ(d.router_init, "zero");
  EXPECT_EQ(d.router_aux_loss_coef, 0.0);
  EXPECT_NO_THROW(validate(d, 32, "mod.config"));
}

TEST(PModConfig, BadValuesAreNamedErrors) {
  auto msg = invalid_argument_of([] {
    mod_config_from_json({{"router", "pmod"}, {"pmod_denominator", "31"}}, "mod.config");
  });
  EXPECT_NE(msg.find("pmod_denominator"), std::string::npos) << msg;
  EXPECT_NE(msg.find("official_31"), std::string::npos) << msg;
  MoDConfig c = pmod_config(32);
  c.mod_layers = {2, 3};
  msg = invalid_argument_of([&] { validate(c, 32, "mod.config"); });
  EXPECT_NE(msg.find("mod_layers_idx"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[8, 9"), std::string::npos) << msg;  // the list the schedule gives
  c = pmod_config(32);
  c.rope_positions = RopePositions::kCompacted;
  msg = invalid_argument_of([&] { validate(c, 32, "mod.config"); });
  EXPECT_NE(msg.find("rope_positions"), std::string::npos) << msg;
  c = pmod_config(32);
  c.pmod_max_ratio = 0.1;
  c.mod_layers = pmod_layers(c, 32);
  msg = invalid_argument_of([&] { validate(c, 32, "mod.config"); });
  EXPECT_NE(msg.find("pmod_max_ratio"), std::string::npos) << msg;
}

TEST(PModConfig, OriginalConfigsGmodDoesNotImplementAreRefusedByKey) {
  const nlohmann::json ok = {{"mod_target_layers", "shiftedcos_decay_0.85_0.15"}, {"mod_router_factor", 0.5},
                             {"mod_weight_norm", "tanh_0.2_1"}, {"mod_bias_enabled", true},
                             {"mod_target_token_type", "vision_all"}};
  const MoDConfig c = pmod_config_from_official(ok, 32, PModDenominator::kOfficial31, "config.json");
  EXPECT_EQ(c.mod_layers, pmod_config(32, PModDenominator::kOfficial31).mod_layers);
  EXPECT_EQ(c.pmod_tanh_scale, 0.2);
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"mod_target_token_type", "vision_hr"}, {"mod_weight_norm", "softmax"}, {"mod_target_layers", "deep_all"}}) {
    auto j = ok;
    j[key] = value;
    const auto msg = invalid_argument_of(
        [&] { pmod_config_from_official(j, 32, PModDenominator::kOfficial31, "config.json"); });
    EXPECT_NE(msg.find(key), std::string::npos) << msg;
    EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
  }
}

TEST(PModConfig, KeptImageCountIsTheOriginalsFloat32Truncation) {
  // The original computes torch.trunc(int32 lengths * ratio), a float32 product: torch gives 63 for 90 tokens at 0.7
  // and 63 for 180 at 0.35, where the exact double products truncate to 62 (computed with torch 2.11).
  EXPECT_EQ(pmod_kept_images(90, 0.7), 63);
  EXPECT_EQ(pmod_kept_images(180, 0.35), 63);
  EXPECT_EQ(pmod_kept_images(64, 0.75), 48);
  EXPECT_EQ(pmod_kept_images(0, 0.5), 0);
}

}  // namespace

// mod.rule "pmod" as the trainer and gmod plan read it (config_for_rule, mod/conversion.h): p-MoD's defaults and the
// schedule's layers; a mod.config with router pmod keeps its own schedule fields (the layers still from the schedule);
// listed layers win; no ARank needed; the kept shares the plan uses follow the ratios.
TEST(PModConfig, TheTrainersRuleGivesTheScheduleAndTheUsersFields) {
  const int n = 6;
  const MoDConfig def = config_for_rule("pmod", MoDConfig{}, n);
  EXPECT_EQ(to_json(def).dump(), to_json(pmod_config(n)).dump());
  EXPECT_FALSE(rule_needs_arank("pmod"));
  EXPECT_FALSE(rule_needs_arank("pmod:official_31"));
  EXPECT_TRUE(rule_needs_arank("keep_top:2"));
  EXPECT_FALSE(rule_needs_arank("arank_mod"));
  EXPECT_THROW(rule_needs_arank("pmod:7"), std::invalid_argument);

  MoDConfig mine = pmod_config(n);
  mine.mod_layers.clear();
  mine.pmod_min_ratio = 0.4;
  mine.pmod_max_ratio = 0.5;  // fewer layers: decay(l) <= 0.5 (3, 4, 5 of 6)
  const MoDConfig got = config_for_rule("pmod", mine, n);
  EXPECT_EQ(got.pmod_min_ratio, 0.4);
  EXPECT_EQ(got.mod_layers, pmod_layers(mine, n));
  EXPECT_LT(got.mod_layers.size(), def.mod_layers.size());
  const std::vector<double> kept = planned_kept_fractions(got, n, 0.5);
  ASSERT_EQ(kept.size(), got.mod_layers.size());
  for (size_t i = 0; i < kept.size(); ++i)
    EXPECT_DOUBLE_EQ(kept[i], 1.0 - (1.0 - pmod_ratio(got, got.mod_layers[i], n)) * 0.5);
  EXPECT_DOUBLE_EQ(kept.back(), 1.0 - (1.0 - 0.4) * 0.5);  // the floor

  MoDConfig listed = pmod_config(n);
  EXPECT_EQ(config_for_rule("keep_top:1", listed, n).mod_layers, listed.mod_layers);
  MoDConfig gamma;
  gamma.skip_frac = 0.3;
  const MoDConfig g = config_for_rule("arank_mod", gamma, n);
  EXPECT_EQ(g.mod_layers, (std::vector<int>{3, 4}));
  EXPECT_EQ(planned_kept_fractions(g, n, 0.5), (std::vector<double>{1.0 - 0.15, 1.0 - 0.15}));
}

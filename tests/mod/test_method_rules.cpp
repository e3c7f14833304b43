// What `gmod convert --rule` asks the registry (mod/method_registry.h, TokenSelector's conversion-rule part): which
// method a rule string belongs to, the options each method's rule refuses, the config it gives, and that every
// rule form a method advertises in --rule's help is one it owns. The CLI's own outputs are checked end to end by
// the cli_convert* entries.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "mod/method_registry.h"
#include "mod/pmod.h"
#include "mod/token_selection.h"
#include "tests/common/error_of.h"

using gmod::test::invalid_argument_of;

using namespace gmod;

namespace {

std::string owner(const std::string& rule) {
  const TokenSelector* m = method_for_rule(rule);
  return m ? m->name() : "";
}

TEST(MethodRules, EachRuleBelongsToItsMethodAndLayerRulesToNone) {
  EXPECT_EQ(owner("fastv:2:0.5"), "fastv");
  EXPECT_EQ(owner("pdrop:8,16,24:0.5,0.25,0.125"), "pdrop");
  EXPECT_EQ(owner("pmod"), "pmod");
  EXPECT_EQ(owner("pmod:official_31"), "pmod");
  EXPECT_EQ(owner("pmod:foo"), "pmod");  // its prefix: p-MoD names the malformed rule itself
  for (const char* rule : {"layers:1,2", "arank_mod", "keep_top:4", "threshold:110", "pmodx", "fastv", ""})
    EXPECT_EQ(owner(rule), "") << rule;
  // The router a config without one gets, and --router's default.
  EXPECT_EQ(default_method_name(), to_string(MoDConfig{}.router));
  EXPECT_EQ(method_named(default_method_name(), "test").kind(), MoDConfig{}.router);
}

TEST(MethodRules, EveryAdvertisedRuleFormIsOwnedByItsMethod) {
  int with_rules = 0;
  for (const TokenSelector* m : registered_methods()) {
    const std::string help = m->rule_help();
    if (help.empty()) continue;
    ++with_rules;
    const std::string form = help.substr(0, help.find(' '));  // "fastv:K:R (FastV: ...)" -> "fastv:K:R"
    EXPECT_EQ(method_for_rule(form), m) << m->name() << ": " << form;
  }
  EXPECT_EQ(with_rules, 3);  // FastV, p-MoD, PyramidDrop
}

TEST(MethodRules, PModRefusesTheOptionsItsScheduleSets) {
  const TokenSelector& pmod = *method_for_rule("pmod");
  ConvertChoices ok;
  ok.router = default_method_name();
  EXPECT_EQ(invalid_argument_of([&] { pmod.check_convert_options("pmod", ok); }), "");
  ConvertChoices own = ok;
  own.router = pmod.name();
  EXPECT_EQ(invalid_argument_of([&] { pmod.check_convert_options("pmod:official_31", own); }), "");
  EXPECT_EQ(invalid_argument_of([&] { pmod.check_convert_options("pmod:foo", ok); }),
            "--rule pmod:foo: expected pmod or pmod:official_31");
  ConvertChoices other = ok;
  other.router = "per_layer";
  EXPECT_NE(
      invalid_argument_of([&] { pmod.check_convert_options("pmod", other); }).find("drop --direct, --router"),
      std::string::npos);
  ConvertChoices skip = ok;
  skip.skip_frac_given = true;
  EXPECT_NE(invalid_argument_of([&] {
              pmod.check_convert_options("pmod", skip);
            }).find("--skip-frac and --forced do not apply"),
            std::string::npos);
  // The config: p-MoD's official one, with --router-init only when given and --router-seed always.
  ConvertChoices init = ok;
  init.router_init = "xavier_uniform";
  init.router_init_given = true;
  init.router_seed = 7;
  const MoDConfig c = pmod.rule_config("pmod", 6, init);
  const MoDConfig want = pmod_config(6);
  EXPECT_EQ(c.mod_layers, want.mod_layers);
  EXPECT_EQ(c.router_init, "xavier_uniform");
  EXPECT_EQ(c.router_init_seed, 7u);
  EXPECT_EQ(pmod.rule_config("pmod", 6, ok).router_init, want.router_init);
  EXPECT_EQ(pmod.rule_config("pmod:official_31", 32, ok).pmod_denominator, PModDenominator::kOfficial31);
  // The image-token share each layer keeps, as the schedule says.
  for (int l : c.mod_layers) EXPECT_EQ(*pmod.image_keep_ratio(c, l, 6), pmod_ratio(c, l, 6));
}

TEST(MethodRules, ParameterFreeRulesRefuseRouterOptionsAndNameTheirSpec) {
  for (const char* rule : {"fastv:2:0.5", "pdrop:2,4:0.5,0.25"}) {
    const TokenSelector& m = *method_for_rule(rule);
    ConvertChoices given;
    given.router = default_method_name();
    EXPECT_EQ(invalid_argument_of([&] { m.check_convert_options(rule, given); }), "") << rule;
    given.adaptive = true;
    EXPECT_EQ(invalid_argument_of([&] { m.check_convert_options(rule, given); }),
              std::string("--rule ") + rule + ": " + m.display_name() +
                  " has no router, so no --direct or --adaptive-threshold");
    EXPECT_TRUE(m.rule_checked_before_weights());
    const MoDConfig c = m.rule_config(rule, 6, ConvertChoices{});
    EXPECT_EQ(c.router, m.kind());
    EXPECT_EQ(c.mod_layers, (std::vector<int>{2, 3, 4, 5})) << rule;
  }
  EXPECT_NE(invalid_argument_of([] {
              method_for_rule("fastv:2:x")->rule_config("fastv:2:x", 6, {});
            }).find("expected K:R"),
            std::string::npos);
}

}  // namespace

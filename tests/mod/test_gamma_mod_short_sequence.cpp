// γ-MoD's short-sequence rule (docs/mod.md "Short sequences"): the ORIGINAL's training MoD layer keeps every token
// of a batch whose padded row length L is at most its hard-coded 1024 + 35 (top-k = L, the MLP delta still scaled by
// p) and routes the first 1059 positions otherwise, whatever they hold. gmod's default (capacity_rule "roles")
// routes every sample by its roles; capacity_rule "official_prefix" reproduces the original. Fixture:
// tests/fixtures/gamma_mod/llava_clip_mod12 (make_gamma_mod_fixtures.py), reference_short.safetensors: the original
// on two text-only samples of L = 48 (no padding); reference.safetensors: the original on L = 1070.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "model/checkpoint_files.h"
#include "model/llava.h"
#include "model/safetensors.h"
#include "mod/conversion.h"
#include "mod/mod_checkpoint.h"
#include "tests/common/paths.h"
#include "tests/mod/gamma_mod_reference.h"

using namespace gmod;
using namespace gmod::test::gamma_mod_ref;

// A named namespace around the file keeps its helpers apart from other files in a unity build.
namespace test_gamma_mod_short_sequence {
namespace {


void set_capacity_rule(MultimodalLM& model, CapacityRule rule) {
  for (auto& l : mod_layers(model)) l->cfg.capacity_rule = rule;
}

}  // namespace

// The original keeps every token of a batch whose padded length L <= 1024 + 35 (top-k = L); capacity_rule
// "official_prefix" does the same, "roles" (the default) routes the samples' 35 system tokens.
TEST(GammaModShortSequence, OfficialPrefixRuleReproducesTheOriginalKeepAll) {
  auto model = load_mod_pretrained(fixture_dir());
  auto mc = read_mod_config(fixture_dir());
  ASSERT_TRUE(mc);
  EXPECT_EQ(mc->capacity_rule, CapacityRule::kRoles);  // the default, also for the original's config
  SafetensorsFile ref(fixture_dir() + "/reference_short.safetensors");
  const auto in = reference_inputs(ref, model->config.image_token_id, 1);
  const int64_t L = in.input_ids.size(1);
  ASSERT_LE(L, mc->official_prefix);

  set_capacity_rule(*model, CapacityRule::kOfficialPrefix);
  const auto r = train_forward(*model, in, *mc);
  const auto want = ref.tensor("logits");
  const double err = (r.out.logits - want).abs().max().item<double>();
  EXPECT_LT(err, logit_tolerance(want));
  EXPECT_NEAR(r.out.lm_loss.item<double>(), ref.tensor("lm_loss").item<double>(), 1e-5);
  EXPECT_NEAR(r.routing.item<double>(), ref.tensor("routing_loss").item<double>(), 1e-7);
  for (const auto& s : r.selected) EXPECT_TRUE(s.all().item<bool>()) << "every token kept";

  set_capacity_rule(*model, CapacityRule::kRoles);
  const auto d = train_forward(*model, in, *mc);
  const double diff = (d.out.logits - want).abs().max().item<double>();
  EXPECT_GT(diff, 100 * logit_tolerance(want)) << "the default rule routes short samples: it must differ";
  for (const auto& s : d.selected)  // floor(35 / 2) of each sample's system tokens skipped
    EXPECT_TRUE(s.logical_not().sum(1).eq(17).all().item<bool>());
  std::cout << "γ-MoD short batch (L = " << L << "): official_prefix max logit diff " << err << ", roles " << diff
            << "\n";
}

// On the long batch (L = 1070 > 1059) the positional prefix is the fixture's roles: the same tokens, the same logits.
TEST(GammaModShortSequence, OfficialPrefixRuleMatchesOnTheLongBatch) {
  auto model = load_mod_pretrained(fixture_dir());
  auto mc = read_mod_config(fixture_dir());
  ASSERT_TRUE(mc);
  SafetensorsFile ref(fixture_dir() + "/reference.safetensors");
  set_capacity_rule(*model, CapacityRule::kOfficialPrefix);
  const auto r = train_forward(*model, reference_inputs(ref, model->config.image_token_id, 2), *mc);
  const double err = (r.out.logits - ref.tensor("logits")).abs().max().item<double>();
  EXPECT_LT(err, logit_tolerance(ref.tensor("logits")));
  for (size_t i = 0; i < r.selected.size(); ++i) {
    const auto idx = ref.tensor("selected.layer" + std::to_string(mc->mod_layers[i]));
    const auto want = at::zeros_like(r.selected[i]).scatter(1, idx, true);
    EXPECT_EQ((want != r.selected[i]).sum().item<int64_t>(), 0);
  }
}

TEST(GammaModShortSequence, CapacityRuleIsAConfigKeyValidatedInOnePlace) {
  auto c = mod_config_from_json({{"mod_layers_idx", {1, 2}}, {"capacity_rule", "official_prefix"},
                                 {"official_prefix", 600}},
                                "cfg");
  EXPECT_EQ(c.capacity_rule, CapacityRule::kOfficialPrefix);
  EXPECT_EQ(c.official_prefix, 600);
  EXPECT_EQ(mod_config_from_json(to_json(c), "round trip").capacity_rule, CapacityRule::kOfficialPrefix);
  EXPECT_EQ(mod_config_from_json(nlohmann::json::object(), "cfg").capacity_rule, CapacityRule::kRoles);
  std::string e;
  try {
    mod_config_from_json({{"capacity_rule", "short"}}, "cfg");
  } catch (const std::exception& ex) {
    e = ex.what();
  }
  EXPECT_NE(e.find("capacity_rule = \"short\", expected one of roles, official_prefix"), std::string::npos) << e;
  c.router = RouterKind::kPerLayer;
  c.official_prefix = 0;
  e.clear();
  try {
    validate(c, 4, "cfg");
  } catch (const std::exception& ex) {
    e = ex.what();
  }
  EXPECT_NE(e.find("capacity_rule \"official_prefix\" reproduces γ-MoD's code; router per_layer"), std::string::npos)
      << e;
  EXPECT_NE(e.find("official_prefix = 0, expected >= 1"), std::string::npos) << e;
}

}  // namespace test_gamma_mod_short_sequence

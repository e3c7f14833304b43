// optimizer.groups: reading (JSON, --set, the effective config), checking, the part of a parameter name,
// first match wins, freezing, named errors for groups that match nothing or only frozen parameters, the LLaVA
// shorthands, the change report on resume, and each group's LR from the schedule.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>

#include "model/config.h"
#include "tests/common/error_of.h"
#include "tests/common/paths.h"
#include "trainer/config/param_groups.h"
#include "trainer/config/train_config.h"
#include "trainer/lr_schedule.h"
#include "trainer/plan/memory_plan.h"
#include "trainer/plan/param_group_counts.h"

using gmod::test::error_of;

using json = nlohmann::json;
using namespace gmod;

namespace {

// A LLaVA-like model's parameters (a few of each part); the tower frozen as freeze.vision does by default.
std::vector<ParamGroupInput> params(bool tower_frozen = false) {
  std::vector<ParamGroupInput> p;
  auto add = [&](const std::string& n, int64_t numel, bool adapter = false, bool frozen = false) {
    p.push_back({n, numel, param_part(n, adapter), frozen});
  };
  add("vision.embeddings.patch_embedding.weight", 100, false, tower_frozen);
  add("vision.align_stages.0.weight", 7, true);
  add("projector.linear_1.weight", 30);
  add("projector.linear_1.bias", 3);
  add("llm.embed_tokens.weight", 50);
  add("llm.layers.0.mlp.up_proj.weight", 40);
  add("llm.layers.0.self_attn.q_proj.lora_A.weight", 8);
  add("llm.layers.1.router.weight", 4);
  add("mod_router.weight", 8);
  add("lm_head.weight", 50);
  return p;
}

}  // namespace

TEST(ParamGroups, PartOfEachParameterName) {
  EXPECT_EQ(param_part("vision.encoder.layers.0.mlp.fc1.weight", false), "vision_tower");
  EXPECT_EQ(param_part("vision.align_stages.0.weight", true), "vision_adapters");
  EXPECT_EQ(param_part("projector.linear_2.bias", false), "projector");
  EXPECT_EQ(param_part("mod_router.weight", false), "routers");
  EXPECT_EQ(param_part("llm.layers.3.router.weight", false), "routers");
  EXPECT_EQ(param_part("llm.layers.3.self_attn.v_proj.lora_B.weight", false), "lora");
  EXPECT_EQ(param_part("llm.layers.3.self_attn.v_proj.weight", false), "llm");
  EXPECT_EQ(param_part("lm_head.weight", false), "llm");
  EXPECT_EQ(param_part("llm.norm.weight", false), "llm");
}

TEST(ParamGroups, ReadFromJsonAndSetAndBackIntoTheEffectiveConfig) {
  const json user = {{"optimizer",
                      {{"lr", 2e-4},
                       {"groups", json::array({{{"name", "proj"}, {"parts", {"projector"}}, {"lr", 2e-5}},
                                               {{"params", {"llm.layers.0.*"}}, {"freeze", true}}})},
                       {"mm_vision_tower_lr", 2e-6}}}};
  TrainConfig c = train_config_from_json(user);
  ASSERT_EQ(c.optimizer.groups.size(), 2u);
  EXPECT_EQ(c.optimizer.groups[0].name, "proj");
  EXPECT_EQ(c.optimizer.groups[0].lr, 2e-5);
  EXPECT_EQ(c.optimizer.groups[0].weight_decay, -1) << "unset: optimizer.weight_decay";
  EXPECT_TRUE(c.optimizer.groups[1].freeze);
  EXPECT_EQ(c.optimizer.mm_vision_tower_lr, 2e-6);
  // The effective config (printed, saved with the run and in checkpoints) reads back to the same groups.
  const json eff = to_json(c);
  EXPECT_EQ(eff["optimizer"]["groups"][0], (json{{"name", "proj"}, {"parts", {"projector"}}, {"lr", 2e-5}}));
  EXPECT_EQ(eff["optimizer"]["groups"][1], (json{{"params", {"llm.layers.0.*"}}, {"freeze", true}}));
  EXPECT_EQ(to_json(train_config_from_json(eff)), eff);
  // --set replaces the array (JSON text).
  TrainConfig s = train_config_from_json(user, {R"(optimizer.groups=[{"parts": ["lora"], "lr": 0.001}])"});
  ASSERT_EQ(s.optimizer.groups.size(), 1u);
  EXPECT_EQ(s.optimizer.groups[0].parts, (std::vector<std::string>{"lora"}));
  // Reading problems name the group and the field.
  const std::string e = error_of([] {
    train_config_from_json(
        {{"optimizer", {{"groups", json::array({{{"parts", "projector"}, {"lr", "high"}}})}}}});
  });
  EXPECT_NE(e.find("optimizer.groups[0].parts: expected an array of strings"), std::string::npos) << e;
  EXPECT_NE(e.find("optimizer.groups[0].lr: expected a number"), std::string::npos) << e;
}

TEST(ParamGroups, FirstMatchWinsAndFreezeGroupsFreeze) {
  OptimizerSection o;
  o.lr = 1e-3;
  o.weight_decay = 0.1;
  ParamGroupConfig layer0, llm, frozen;
  layer0.name = "layer0";
  layer0.params = {"llm.layers.0.*"};
  layer0.lr = 5e-4;
  llm.parts = {"llm", "lora"};
  llm.lr = 2e-4;
  llm.weight_decay = 0.0;
  frozen.params_regex = {"^mod_router\\."};
  frozen.freeze = true;
  o.groups = {layer0, llm, frozen};
  o.mm_projector_lr = 2e-5;
  const auto in = params();
  const ResolvedParamGroups r = resolve_param_groups(o, in);
  ASSERT_EQ(r.groups.size(), 5u);  // default, layer0, group1, group2, mm_projector_lr
  EXPECT_EQ(r.groups[2].name, "group1");
  EXPECT_EQ(r.groups[4].name, "mm_projector_lr");
  EXPECT_EQ(r.groups[4].key, "optimizer.mm_projector_lr");
  EXPECT_EQ(r.groups[4].lr, 2e-5);
  EXPECT_EQ(r.groups[4].weight_decay, 0.1) << "unset: the base";
  std::map<std::string, int> g;
  for (size_t i = 0; i < in.size(); ++i) g[in[i].name] = r.group_of[i];
  EXPECT_EQ(g["llm.layers.0.mlp.up_proj.weight"], 1);
  EXPECT_EQ(g["llm.layers.0.self_attn.q_proj.lora_A.weight"], 1)
      << "the glob of an earlier group wins over part lora";
  EXPECT_EQ(g["lm_head.weight"], 2);
  EXPECT_EQ(g["llm.embed_tokens.weight"], 2);
  EXPECT_EQ(g["mod_router.weight"], -1);
  EXPECT_EQ(g["llm.layers.1.router.weight"], 0) << "no group matches: default";
  EXPECT_EQ(g["projector.linear_1.bias"], 4);
  EXPECT_EQ(g["vision.align_stages.0.weight"], 0);
  EXPECT_EQ(r.groups[1].params, 48);
  EXPECT_EQ(r.groups[1].tensors, 2);
  EXPECT_EQ(r.groups[3].frozen_params, 8);
  EXPECT_EQ(r.groups[0].params, 100 + 7 + 4);
  EXPECT_EQ(r.to_json()[4], (json{{"name", "mm_projector_lr"},
                                  {"lr", 2e-5},
                                  {"weight_decay", 0.1},
                                  {"freeze", false},
                                  {"params", 33},
                                  {"tensors", 2}}));
}

TEST(ParamGroups, GroupsThatMatchNothingOrOnlyFrozenParametersAreNamed) {
  OptimizerSection o;
  ParamGroupConfig typo, routers;
  typo.name = "typo";
  typo.params = {"llm.layer.*"};
  o.groups = {typo};
  std::string e = error_of([&] { resolve_param_groups(o, params()); });
  EXPECT_NE(
      e.find("optimizer.groups[0] (typo): params llm.layer.* matches no parameter of the model (its parts: "
             "llm, lora, projector, routers, vision_adapters, vision_tower"),
      std::string::npos)
      << e;
  // An earlier group took every router: the later one matches nothing.
  routers.parts = {"routers"};
  ParamGroupConfig all;
  all.params = {"*"};
  o.groups = {all, routers};
  e = error_of([&] { resolve_param_groups(o, params()); });
  EXPECT_NE(e.find("optimizer.groups[1] (group1): parts routers matches no parameter"), std::string::npos)
      << e;
  // mm_vision_tower_lr while freeze.vision keeps the tower frozen: applies to nothing.
  o.groups.clear();
  o.mm_vision_tower_lr = 2e-6;
  e = error_of([&] { resolve_param_groups(o, params(/*tower_frozen=*/true)); });
  EXPECT_NE(
      e.find("optimizer.mm_vision_tower_lr (mm_vision_tower_lr): parts vision_tower matches 100 parameters, "
             "all frozen"),
      std::string::npos)
      << e;
  EXPECT_NO_THROW(resolve_param_groups(o, params(false)));
}

TEST(ParamGroups, ValidationNamesEveryProblem) {
  TrainConfig c;
  ParamGroupConfig a, b, d;
  a.name = "x";
  a.parts = {"vision"};
  b.name = "x";
  b.params_regex = {"("};
  b.lr = -2;
  d.freeze = true;
  d.weight_decay = 0.1;
  d.parts = {"projector"};
  c.optimizer.groups = {a, b, d, ParamGroupConfig{}};
  c.optimizer.mm_projector_lr = 1e-5;
  const auto errs = check_param_groups(c.optimizer);
  std::string all;
  for (const auto& m : errs) all += m + "\n";
  for (const char* want :
       {"optimizer.groups[0].parts: unknown part \"vision\", expected one of projector",
        "optimizer.groups[1].params_regex: \"(\" is not a valid regex",
        "optimizer.groups[1].lr: -2, expected >= 0", "optimizer.groups[1].name: \"x\" is used twice",
        "optimizer.groups[2]: freeze with lr or weight_decay", "optimizer.groups[3]: selects nothing",
        "optimizer.mm_projector_lr: optimizer.groups[2] names part projector too"})
    EXPECT_NE(all.find(want), std::string::npos) << want << "\n" << all;
}

TEST(ParamGroups, ChangesOnResumeAreDescribed) {
  OptimizerSection o;
  o.mm_projector_lr = 2e-5;
  const ResolvedParamGroups a = resolve_param_groups(o, params());
  EXPECT_EQ(describe_group_changes(a.to_json(), a), "");
  o.mm_projector_lr = 4e-5;
  const ResolvedParamGroups b = resolve_param_groups(o, params());
  EXPECT_EQ(describe_group_changes(a.to_json(), b),
            "\n  group mm_projector_lr lr: checkpoint 2e-05, now 4e-05");
  o.mm_projector_lr = 0;
  const std::string gone = describe_group_changes(a.to_json(), resolve_param_groups(o, params()));
  EXPECT_NE(gone.find("group mm_projector_lr: gone"), std::string::npos) << gone;
  EXPECT_NE(gone.find("group default params: checkpoint"), std::string::npos) << gone;
}

// Every group follows the schedule's shape from its own peak; the base peak gives the base LR bitwise, and
// the floor scales with the peak.
TEST(ParamGroups, ScheduleScalesEachGroupsPeak) {
  const LRSchedule s(2e-4, 2e-5, 3, 20);
  for (int64_t k = 0; k < 22; ++k) {
    EXPECT_EQ(s.lr_at(k, 2e-4), s.lr_at(k)) << k;
    const double f = s.lr_at(k) / 2e-4;
    EXPECT_NEAR(s.lr_at(k, 2e-5), 2e-5 * f, 1e-18) << k;
    EXPECT_EQ(s.lr_at(k, 0.0), 0.0) << k;
  }
  EXPECT_NEAR(s.lr_at(21, 2e-5), 2e-6, 1e-18) << "the floor is min_lr * peak / lr";
  EXPECT_EQ(s.lr_at(0, 6e-3), 6e-3 / 3);
}

// gmod plan resolves the groups on the real model's names: a frozen decoder layer and the projector group
// count exactly what the plan's own per-part arithmetic (count_params) says they hold, and the frozen layer
// leaves the trainable set.
TEST(ParamGroups, PlanCountsGroupsOnTheModelsNames) {
  TrainConfig c;
  c.model.path = gmod::test::source_dir() + "/configs/demo_model";
  c.freeze.vision = true;
  ParamGroupConfig layer0;
  layer0.name = "layer0";
  layer0.params = {"llm.layers.0.*"};
  layer0.freeze = true;
  c.optimizer.groups = {layer0};
  c.optimizer.mm_projector_lr = 1e-3;
  const LlavaConfig m = load_model_config(c.model.path);
  const PlanParamGroups g = plan_param_groups(c, m, {});
  const ParamCounts pc = count_params(m, {}, "gamma_shared");
  EXPECT_EQ(g.frozen_by_groups, pc.llm_layer[0]);
  ASSERT_EQ(g.groups.groups.size(), 3u);
  EXPECT_EQ(g.groups.groups[1].frozen_params, pc.llm_layer[0]);
  EXPECT_EQ(g.groups.groups[2].params, pc.projector);
  EXPECT_EQ(g.groups.groups[0].params, pc.llm - pc.llm_layer[0]);
  EXPECT_TRUE(g.problems.empty());
  MemoryPlanInputs in = plan_inputs_from_config(c, m, 2);
  const int64_t before = plan_memory(in).params_trainable;
  in.frozen_by_groups = g.frozen_by_groups;
  EXPECT_EQ(plan_memory(in).params_trainable, before - pc.llm_layer[0]);
  // A group that matches nothing is reported, not thrown (gmod train refuses it).
  ParamGroupConfig typo;
  typo.params = {"llm.layer.*"};
  c.optimizer.groups = {typo};
  const PlanParamGroups t = plan_param_groups(c, m, {});
  ASSERT_EQ(t.problems.size(), 1u);
  EXPECT_NE(t.problems[0].find("matches no parameter"), std::string::npos) << t.problems[0];
}

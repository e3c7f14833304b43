// optimizer.groups end to end (`gmod train` on the tiny demo model, tests/trainer/e2e_util.h), at 1 and 2
// ranks and every ZeRO stage: groups whose settings equal the base ones train bitwise like no groups; after
// one step a group with lr 0 holds its initial bits and a group with lr x holds bitwise what an ungrouped run
// with lr x gives those parameters (the first update depends only on the initial gradient); grouped runs
// resume bitwise; a changed group lr on resume is named and applied; metrics log every group's lr. The
// per-element oracle (torch's AdamW with param_groups) is tests/parallel/test_adamw_groups.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "model/strings.h"
#include "tests/common/paths.h"
#include "tests/trainer/e2e_util.h"
#include "trainer/model_setup.h"

namespace {

using json = nlohmann::json;
using namespace gmod::test;
using namespace gmod::e2e;
using gmod::starts_with;

// The e2e config with the vision tower trained (so it can have a group), weight decay on, and the collective
// deadline of these runs.
std::string config(const std::string& run_dir, const json& extra = json::object()) {
  json e{{"freeze", {{"vision", false}}},
         {"optimizer", {{"weight_decay", 0.1}}},
         {"parallel", {{"timeout_s", 600.0}}}};
  e.merge_patch(extra);
  return write_config(run_dir, e);
}

// The ZeRO settings each test repeats under: (world, --set ...).
const std::vector<std::pair<int, std::vector<std::string>>>& layouts() {
  static const std::vector<std::pair<int, std::vector<std::string>>> l{
      {1, {"optimizer.zero_stage=0"}},
      {2, {"optimizer.zero_stage=1", "optimizer.offload=cpu"}},
      {2, {"optimizer.zero_stage=2"}},
      {2, {"optimizer.zero_stage=3"}}};
  return l;
}

std::string describe(int world, const std::vector<std::string>& sets) {
  std::string s = std::to_string(world) + " rank(s)";
  for (const auto& x : sets) s += " " + x;
  return s;
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const char* kEqualGroups =
    R"(optimizer.groups=[{"name": "projector", "parts": ["projector"], "lr": 0.002, "weight_decay": 0.1},)"
    R"( {"name": "tower", "parts": ["vision_tower"]}, {"name": "mlp", "params": ["llm.layers.*.mlp.*"]}])";

}  // namespace

// Groups with the base lr and weight decay change nothing: weights and optimizer state bitwise those of a run
// without groups, at every stage.
TEST(GroupsE2E, GroupsWithBaseSettingsEqualNoGroups) {
  for (const auto& [world, sets] : layouts()) {
    SCOPED_TRACE(describe(world, sets));
    TempDir t;
    const std::string a = t.str("plain"), b = t.str("grouped");
    const std::vector<std::string> s = with(sets, {"schedule.max_steps=3"});
    ASSERT_EQ(gmod_train(world, config(a), s), 0) << slurp(a + ".config.json.log");
    ASSERT_EQ(gmod_train(world, config(b), with(s, {kEqualGroups})), 0) << slurp(b + ".config.json.log");
    const std::string log = slurp(b + ".config.json.log");
    EXPECT_NE(log.find("optimizer: group mlp (optimizer.groups[2]): lr 0.002"), std::string::npos) << log;
    expect_same_model(ckpt(a, 3), ckpt(b, 3));
    for (const char* n : {"master", "exp_avg", "exp_avg_sq"})
      EXPECT_TRUE(bit_equal(flat_optimizer(ckpt(a, 3), n), flat_optimizer(ckpt(b, 3), n))) << n;
  }
}

// One step: the projector at lr 5e-3 (weight decay 0.1 as the base) moves exactly as in an ungrouped run at
// lr 5e-3, the tower at lr 0 keeps the initial weights bitwise, and the rest (base lr 2e-3) differs from that
// run.
TEST(GroupsE2E, LrZeroGroupKeepsItsBitsAndLrXGroupMovesAsUngroupedLrX) {
  json model_cfg = json::parse(slurp(config(TempDir().str("probe"))))["model"];
  gmod::ModelSection ms;
  ms.path = model_cfg["path"].get<std::string>();
  ms.init = "random";
  ms.init_seed = model_cfg["init_seed"].get<uint64_t>();
  auto init_model = gmod::load_run_model(ms, at::kFloat);
  std::map<std::string, at::Tensor> init;
  for (auto& item : init_model->named_parameters()) init[item.key()] = item.value().detach();

  for (const auto& [world, sets] : layouts()) {
    SCOPED_TRACE(describe(world, sets));
    TempDir t;
    const std::string x = t.str("ungrouped_lr_x"), g = t.str("grouped");
    const std::vector<std::string> s = with(sets, {"schedule.exit_at_step=1"});
    ASSERT_EQ(gmod_train(world, config(x), with(s, {"optimizer.lr=0.005"})), 0)
        << slurp(x + ".config.json.log");
    ASSERT_EQ(
        gmod_train(world, config(g),
                   with(s, {R"(optimizer.groups=[{"name": "tower", "parts": ["vision_tower"], "lr": 0}])",
                            "optimizer.mm_projector_lr=0.005"})),
        0)
        << slurp(g + ".config.json.log");
    const auto mx = gmod::CheckpointReader(ckpt(x, 1)).read_model(),
               mg = gmod::CheckpointReader(ckpt(g, 1)).read_model();
    ASSERT_EQ(mx.size(), mg.size());
    int projector = 0, tower = 0, rest_differs = 0;
    for (size_t i = 0; i < mg.size(); ++i) {
      const std::string& name = mg[i].first;
      if (starts_with(name, "projector.")) {
        EXPECT_TRUE(bit_equal(mg[i].second, mx[i].second)) << name;
        EXPECT_FALSE(bit_equal(mg[i].second, init.at(name))) << name << " did not move";
        ++projector;
      } else if (starts_with(name, "vision.")) {
        EXPECT_TRUE(bit_equal(mg[i].second, init.at(name))) << name << " moved at lr 0";
        ++tower;
      } else if (init.count(name) && !bit_equal(mg[i].second, mx[i].second)) {
        ++rest_differs;  // base lr 2e-3 vs 5e-3 (routers are not in the fresh model: skipped)
      }
    }
    EXPECT_GT(projector, 0);
    EXPECT_GT(tower, 0);
    EXPECT_GT(rest_differs, 0);
    // Metrics: every group's lr of the step (warmup 2: half the peak at step 1).
    const auto m = step_metrics(g);
    ASSERT_TRUE(m.count(1));
    EXPECT_EQ(m.at(1)["lr"].get<double>(), 0.002 * 1 / 2);
    EXPECT_EQ(m.at(1)["lr_groups"]["default"].get<double>(), 0.002 * 1 / 2);
    EXPECT_EQ(m.at(1)["lr_groups"]["mm_projector_lr"].get<double>(), 0.005 * 1 / 2);
    EXPECT_EQ(m.at(1)["lr_groups"]["tower"].get<double>(), 0.0);
  }
}

// N + M steps straight == N steps, stop, resume, M steps, with groups (one frozen by pattern) at 2 ranks,
// ZeRO-2: weights, optimizer state, losses and every group's lr per step bitwise; the cosine part of the
// schedule scales each group's peak (min_lr 1e-4 scaled by the group's peak / lr).
TEST(GroupsE2E, GroupedRunResumesBitwiseTwoRanks) {
  TempDir t;
  const std::string u = t.str("uninterrupted"), s = t.str("stopped");
  const std::vector<std::string> sets{
      "optimizer.zero_stage=2",
      R"(optimizer.groups=[{"name": "layer0", "params": ["llm.layers.0.*"], "freeze": true},)"
      R"( {"name": "routers", "parts": ["routers"], "lr": 0.01, "weight_decay": 0},)"
      R"( {"name": "tower", "parts": ["vision_tower"], "lr": 0.0005}])",
      "optimizer.mm_projector_lr=0.004"};
  ASSERT_EQ(gmod_train(2, config(u), sets), 0) << slurp(u + ".config.json.log");
  ASSERT_EQ(gmod_train(2, config(s), with(sets, {"schedule.exit_at_step=3"})), 0)
      << slurp(s + ".config.json.log");
  ASSERT_TRUE(std::filesystem::exists(ckpt(s, 3)));
  ASSERT_EQ(gmod_train(2, config(s), sets), 0) << slurp(s + ".config.json.log");
  const std::string log = slurp(s + ".config.json.log");
  EXPECT_NE(log.find("resume: " + ckpt(s, 3)), std::string::npos) << log;
  EXPECT_EQ(log.find("optimizer.groups changed on resume"), std::string::npos) << log;
  EXPECT_NE(log.find("optimizer: group layer0 (optimizer.groups[0]): frozen"), std::string::npos) << log;

  std::vector<int64_t> order;
  auto mu = step_metrics(u), ms = step_metrics(s, &order);
  EXPECT_EQ(order, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  ASSERT_EQ(mu.size(), 6u);
  for (int64_t k = 1; k <= 6; ++k)
    for (const char* f : {"loss", "grad_norm", "lr", "lr_groups"})
      EXPECT_EQ(mu[k][f].dump(), ms[k][f].dump()) << "step " << k << " " << f;
  // The schedule (warmup 2, cosine to min_lr 1e-4 over 6 steps, base lr 2e-3) from each group's own peak.
  for (int64_t k = 1; k <= 6; ++k) {
    const int64_t st = k - 1;
    for (const auto& [name, peak] : std::vector<std::pair<std::string, double>>{
             {"default", 2e-3}, {"routers", 1e-2}, {"tower", 5e-4}, {"mm_projector_lr", 4e-3}}) {
      double want;
      if (st < 2) {
        want = peak * double(st + 1) / 2.0;
      } else {
        const double p = std::min(1.0, double(st - 2) / 4.0), mn = 1e-4 * (peak / 2e-3);
        want = mn + (peak - mn) * 0.5 * (1.0 + std::cos(M_PI * p));
      }
      EXPECT_NEAR(ms[k]["lr_groups"][name].get<double>(), want, 1e-15) << name << " step " << k;
    }
    EXPECT_FALSE(ms[k]["lr_groups"].contains("layer0")) << "frozen groups have no lr";
  }
  expect_same_model(ckpt(u, 6), ckpt(s, 6));
  for (const char* n : {"master", "exp_avg", "exp_avg_sq"})
    EXPECT_TRUE(bit_equal(flat_optimizer(ckpt(u, 6), n), flat_optimizer(ckpt(s, 6), n))) << n;
  // The frozen layer is not in the optimizer and never moved.
  const auto layout = gmod::CheckpointReader(ckpt(s, 6)).read_all_rank_states()[0].meta["layout"];
  EXPECT_EQ(layout.dump().find("llm.layers.0."), std::string::npos);
  // The checkpoint holds the groups.
  const json groups = gmod::CheckpointReader(ckpt(s, 6)).trainer_state()["param_groups"];
  ASSERT_EQ(groups.size(), 5u) << groups.dump();
  EXPECT_EQ(groups[2]["name"], "routers");
  EXPECT_EQ(groups[2]["lr"].get<double>(), 0.01);
}

// Resuming with another lr for a group: named in a warning, applied from the next step (the moments are per
// element, whatever the group).
TEST(GroupsE2E, ChangedGroupLrOnResumeIsNamedAndApplied) {
  TempDir t;
  const std::string s = t.str("run");
  const std::vector<std::string> sets{"optimizer.zero_stage=1", "optimizer.mm_projector_lr=0.004"};
  ASSERT_EQ(gmod_train(2, config(s), with(sets, {"schedule.exit_at_step=3"})), 0)
      << slurp(s + ".config.json.log");
  ASSERT_EQ(gmod_train(2, config(s), {"optimizer.zero_stage=1", "optimizer.mm_projector_lr=0.008"}), 0)
      << slurp(s + ".config.json.log");
  const std::string log = slurp(s + ".config.json.log");
  EXPECT_NE(
      log.find(
          "warning: optimizer.groups changed on resume from " + ckpt(s, 3) +
          "; the new settings apply from step 4:\n  group mm_projector_lr lr: checkpoint 0.004, now 0.008"),
      std::string::npos)
      << log;
  const auto m = step_metrics(s);
  auto ratio = [&](int64_t k) {
    return m.at(k)["lr_groups"]["mm_projector_lr"].get<double>() / m.at(k)["lr"].get<double>();
  };
  EXPECT_NEAR(ratio(3), 2.0, 1e-12);
  EXPECT_NEAR(ratio(4), 4.0, 1e-12);
}

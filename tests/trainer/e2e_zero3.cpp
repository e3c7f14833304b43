// ZeRO-3 (`optimizer.zero_stage: 3`, parallel/zero3_driver.h) end to end: the real `gmod train` under mpirun
// on the demo dataset and tiny demo model (MoD layers with γ-MoD's shared router), against ZeRO-2 as the
// oracle. Stage 3 gathers each unit's parameters around its forward and backward and reduces gradients per
// unit, ZeRO-2 keeps every parameter and reduces buckets; both must give bitwise the same losses, gradient
// norms, skip verdicts, weights and optimizer state, and checkpoints must move between them at other world
// sizes bitwise. Each test is its own ctest entry (CMakeLists.txt).
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "tests/trainer/e2e_util.h"

namespace {

using namespace gmod::e2e;
using gmod::test::TempDir;

// `gmod train` at np ranks with `env` (NAME=value, "" for none) set on every rank.
int train(int np, const std::string& run_dir, const json& extra, const std::vector<std::string>& sets,
          const std::string& env = "") {
  const std::string config = write_config(run_dir, extra);
  std::string cmd = train_command(np, config, sets);
  if (!env.empty()) {
    const std::string name = env.substr(0, env.find('='));
    if (np > 0) cmd.insert(cmd.find(GMOD_MPIEXEC_NP), "-x " + name + " ");
    cmd = "env " + env + " " + cmd;
  }
  return run_shell(cmd);
}

// The demo training set with every third record made text-only, so that on most steps some rank's micro-batch
// has no image and its forward skips the vision units the other ranks run (the gathers must still pair up).
std::string mixed_data() {
  static const std::string path = [] {
    json d = json::parse(slurp(env().data + "/train.json"));
    for (size_t i = 0; i < d.size(); i += 3) {
      d[i].erase("image");
      std::string& q = d[i]["conversations"][0]["value"].get_ref<std::string&>();
      if (q.rfind("<image>\n", 0) == 0) q = q.substr(8);
    }
    const std::string out = env().data + "/train_mixed.json";
    std::ofstream(out) << d.dump(1);
    return out;
  }();
  return path;
}

std::string log_of(const std::string& run_dir) { return slurp(run_dir + ".config.json.log"); }

// Everything a ZeRO-2 run and a ZeRO-3 run must agree on, bitwise: per-step metrics and the checkpoint.
void expect_same_run(const std::string& a, const std::string& b, int64_t last_step) {
  const auto ma = step_metrics(a), mb = step_metrics(b);
  for (int64_t k = 1; k <= last_step; ++k) {
    ASSERT_TRUE(ma.count(k) && mb.count(k)) << "step " << k;
    for (const char* f : {"loss", "lm_loss", "routing_loss", "grad_norm", "skipped", "skip_ratio"})
      EXPECT_EQ(ma.at(k).value(f, json()).dump(), mb.at(k).value(f, json()).dump())
          << "step " << k << " " << f;
  }
  expect_same_model(ckpt(a, last_step), ckpt(b, last_step));
  for (const char* n : {"master", "exp_avg", "exp_avg_sq"})
    EXPECT_TRUE(bit_equal(flat_optimizer(ckpt(a, last_step), n), flat_optimizer(ckpt(b, last_step), n))) << n;
}

// Trainable CLIP layers (hooked vision units, which a rank whose micro-batch has no image skips), a frozen
// decoder layer, accumulation (global batch 6), clipping (small max norm), weight decay groups, MoD with the
// shared router.
json exact() {
  return json{{"data", {{"train", mixed_data()}}},
              {"batch", {{"global_batch", 6}}},
              {"schedule", {{"max_steps", 4}}},
              {"optimizer", {{"max_grad_norm", 0.05}, {"weight_decay", 0.1}}},
              {"freeze", {{"vision", false}, {"llm_layers", {"1"}}}},
              {"metrics", {{"log_every", 1}}}};
}

// `in_log`: what the stage-3 run's log must say of the driver it built (its prefetch depth, reshard setting).
void expect_stage3_equals_stage2(int np, const std::vector<std::string>& sets, const std::string& env,
                                 const std::string& in_log = "") {
  TempDir t;
  const std::string z2 = t.str("z2"), z3 = t.str("z3");
  std::vector<std::string> s2 = sets, s3 = sets;
  s2.push_back("optimizer.zero_stage=2");
  s3.push_back("optimizer.zero_stage=3");
  ASSERT_EQ(train(np, z2, exact(), s2, env), 0) << log_of(z2);
  ASSERT_EQ(train(np, z3, exact(), s3, env), 0) << log_of(z3);
  EXPECT_NE(log_of(z3).find("optimizer: ZeRO-3, "), std::string::npos) << log_of(z3);
  EXPECT_NE(log_of(z3).find(in_log), std::string::npos) << "expected \"" << in_log << "\" in " << log_of(z3);
  expect_same_run(z2, z3, 4);
  if (!env.empty()) {
    EXPECT_TRUE(step_metrics(z3).at(2).value("skipped", false)) << "the injected NaN must skip step 2";
    EXPECT_FALSE(step_metrics(z3).at(3).value("skipped", true));
  }
}

std::string nan_on_last_rank(int np) {
  return "GMOD_FAULT_INJECT=nonfinite_grad:step=2,rank=" + std::to_string(std::max(0, np - 1));
}

}  // namespace

TEST(Zero3E2E, EqualsZero2OneRank) { expect_stage3_equals_stage2(0, {}, nan_on_last_rank(1)); }
TEST(Zero3E2E, EqualsZero2TwoRanks) { expect_stage3_equals_stage2(2, {}, nan_on_last_rank(2)); }
TEST(Zero3E2E, EqualsZero2ThreeRanks) { expect_stage3_equals_stage2(3, {}, nan_on_last_rank(3)); }
// Prefetch depth changes when units are gathered, never what is computed.
TEST(Zero3E2E, EqualsZero2TwoRanksPrefetch0And3) {
  expect_stage3_equals_stage2(2, {"optimizer.zero3_prefetch=0"}, "", "prefetch 0");
  expect_stage3_equals_stage2(2, {"optimizer.zero3_prefetch=3"}, "", "prefetch 3");
}
// bf16 parameters: the same bf16 forward, the same bf16 .grad accumulation, the same per-element fp32
// reduction and the same fp32 -> bf16 write of the master as stage 2, so bitwise too.
TEST(Zero3E2E, EqualsZero2TwoRanksBf16) { expect_stage3_equals_stage2(2, {"model.dtype=bf16"}, ""); }
// Checkpointed decoder layers and CLIP layers: the recompute runs on the units gathered by the output hook.
TEST(Zero3E2E, EqualsZero2WithActivationCheckpointing) {
  expect_stage3_equals_stage2(2, {"model.activation_checkpointing=full"}, nan_on_last_rank(2));
}

// Without reshard after forward (units kept gathered from their forward to their backward, no backward
// gathers on any rank, also not for the vision units a text-only rank skipped): the same numbers, at 2 ranks
// and at 3 ranks with checkpointing and prefetch 0 (the recompute reads the kept units).
TEST(Zero3E2E, EqualsZero2NoReshardAfterForward) {
  expect_stage3_equals_stage2(2, {"optimizer.zero3_reshard_after_forward=false"}, nan_on_last_rank(2),
                              "prefetch 1, no reshard after forward");
  expect_stage3_equals_stage2(3,
                              {"optimizer.zero3_reshard_after_forward=false",
                               "model.activation_checkpointing=full", "optimizer.zero3_prefetch=0"},
                              "", "prefetch 0, no reshard after forward");
}

// Checkpoints move both ways across stage and world size: [ZeRO-3 at 2 ranks to step 2, then ZeRO-2 at 3
// ranks] and [ZeRO-2 at 3 ranks to step 2, then ZeRO-3 at 2 ranks] equal the same runs at ZeRO-2 throughout,
// bitwise.
TEST(Zero3E2E, CheckpointsMoveBetweenStagesAndWorldSizes) {
  TempDir t;
  for (const auto& [first_np, second_np] : {std::pair<int, int>{2, 3}, std::pair<int, int>{3, 2}}) {
    SCOPED_TRACE(std::to_string(first_np) + " -> " + std::to_string(second_np) + " ranks");
    const std::string tag = std::to_string(first_np) + std::to_string(second_np);
    std::string ref_a = t.str("ref_a" + tag), ref_b = t.str("ref_b" + tag);
    std::string a = t.str("a" + tag), b = t.str("b" + tag);
    // Reference: ZeRO-2 in both halves.
    ASSERT_EQ(train(first_np, ref_a, exact(), {"optimizer.zero_stage=2", "schedule.exit_at_step=2"}), 0)
        << log_of(ref_a);
    ASSERT_EQ(train(second_np, ref_b, exact(), {"optimizer.zero_stage=2", "resume=" + ckpt(ref_a, 2)}), 0)
        << log_of(ref_b);
    // ZeRO-3 in the half at 2 ranks, ZeRO-2 in the other.
    const std::string st1 = first_np == 2 ? "3" : "2", st2 = second_np == 2 ? "3" : "2";
    ASSERT_EQ(train(first_np, a, exact(), {"optimizer.zero_stage=" + st1, "schedule.exit_at_step=2"}), 0)
        << log_of(a);
    ASSERT_EQ(train(second_np, b, exact(), {"optimizer.zero_stage=" + st2, "resume=" + ckpt(a, 2)}), 0)
        << log_of(b);
    EXPECT_NE(log_of(b).find("ZeRO-" + st2 + ";"), std::string::npos) << log_of(b);
    expect_same_model(ckpt(ref_a, 2), ckpt(a, 2));
    for (const char* n : {"master", "exp_avg", "exp_avg_sq"})
      EXPECT_TRUE(bit_equal(flat_optimizer(ckpt(ref_a, 2), n), flat_optimizer(ckpt(a, 2), n))) << n;
    expect_same_model(ckpt(ref_b, 4), ckpt(b, 4));
    for (const char* n : {"master", "exp_avg", "exp_avg_sq"})
      EXPECT_TRUE(bit_equal(flat_optimizer(ckpt(ref_b, 4), n), flat_optimizer(ckpt(b, 4), n))) << n;
  }
}

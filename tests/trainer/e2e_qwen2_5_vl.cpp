// The tiny Qwen2.5-VL γ-MoD run of CI (configs/tiny_qwen2_5_vl_gamma_mod.json: native-resolution images, 3-D
// M-RoPE positions, the vision encoder trained, ARank at start, the shared γ-MoD router) on 2 ranks, the way the
// LLaVA runs are held (issue 45 item 4): stopped and resumed it ends bitwise where the uninterrupted run ends, and
// ZeRO-3 (the encoder's blocks and merger as units, every unit recomputed in the backward) computes bitwise what
// ZeRO-2 computes.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "tests/common/paths.h"
#include "tests/trainer/e2e_util.h"

namespace {

using json = nlohmann::json;
using namespace gmod::test;
using namespace gmod::e2e;

// `gmod train` on configs/tiny_qwen2_5_vl_gamma_mod.json under mpirun at 2 ranks, from the source dir (the config
// names its model, data and images relative to it), the run dir under the test's temporary dir. Output appends to
// <run_dir>.log.
int tiny_qwen(const std::string& run_dir, const std::vector<std::string>& sets) {
  std::string cmd = "cd " + source_dir() + " && " + GMOD_MPIEXEC + " " + GMOD_MPIEXEC_NP + " 2 " + GMOD_MPIRUN_FLAGS +
                    " " + GMOD_BIN + " train --threads 1 --config configs/tiny_qwen2_5_vl_gamma_mod.json" +
                    " --set run_dir=" + run_dir + " --set resume=auto --set schedule.max_steps=4" +
                    " --set checkpoint.every=2 --set parallel.timeout_s=600";
  for (const auto& s : sets) cmd += " --set '" + s + "'";
  return run_shell(cmd + " >> " + run_dir + ".log 2>&1");
}

// Per-step metrics, the weights and the optimizer state of two runs at step 4, bitwise.
void expect_same_run(const std::string& a, const std::string& b) {
  auto ma = step_metrics(a), mb = step_metrics(b);
  ASSERT_EQ(ma.size(), 4u);
  ASSERT_EQ(mb.size(), 4u);
  for (int64_t k = 1; k <= 4; ++k)
    for (const char* f : {"loss", "lm_loss", "routing_loss", "grad_norm", "skip_ratio", "tokens"})
      EXPECT_EQ(ma[k][f].dump(), mb[k][f].dump()) << "step " << k << " " << f;
  expect_same_model(ckpt(a, 4), ckpt(b, 4));
  for (const char* n : {"master", "exp_avg", "exp_avg_sq"})
    EXPECT_TRUE(bit_equal(flat_optimizer(ckpt(a, 4), n), flat_optimizer(ckpt(b, 4), n))) << n;
}

}  // namespace

// 4 steps straight == 2 steps, stop (schedule.exit_at_step), resume, 2 more.
TEST(TrainQwen25VLE2E, TinyQwen25VLGammaModResumesBitwise) {
  TempDir t;
  const std::string u = t.str("uninterrupted"), s = t.str("stopped");
  ASSERT_EQ(tiny_qwen(u, {}), 0) << slurp(u + ".log");
  ASSERT_EQ(tiny_qwen(s, {"schedule.exit_at_step=2"}), 0) << slurp(s + ".log");
  ASSERT_TRUE(std::filesystem::exists(ckpt(s, 2)));
  ASSERT_FALSE(std::filesystem::exists(ckpt(s, 4)));
  ASSERT_EQ(tiny_qwen(s, {}), 0) << slurp(s + ".log");
  const std::string log = slurp(s + ".log");
  EXPECT_NE(log.find("resume: " + ckpt(s, 2)), std::string::npos) << log;
  EXPECT_NE(log.find("MoD layers"), std::string::npos) << log;
  std::vector<int64_t> order;
  step_metrics(s, &order);
  EXPECT_EQ(order, (std::vector<int64_t>{1, 2, 3, 4}));
  expect_same_run(u, s);
  // Tokens were skipped: some MoD layer's skip ratio at step 1 is positive.
  const json skip = step_metrics(u)[1]["skip_ratio"];
  double most = 0;
  if (skip.is_number()) most = skip.get<double>();
  for (const auto& v : skip) if (v.is_number()) most = std::max(most, v.get<double>());
  EXPECT_GT(most, 0.0) << skip.dump();
}

// ZeRO-3 with every unit checkpointed against ZeRO-2 with the same checkpointing.
TEST(TrainQwen25VLE2E, TinyQwen25VLGammaModZero3EqualsZero2) {
  TempDir t;
  const std::string z2 = t.str("z2"), z3 = t.str("z3");
  ASSERT_EQ(tiny_qwen(z2, {"optimizer.zero_stage=2", "model.activation_checkpointing=full"}), 0) << slurp(z2 + ".log");
  ASSERT_EQ(tiny_qwen(z3, {"optimizer.zero_stage=3", "model.activation_checkpointing=full"}), 0) << slurp(z3 + ".log");
  EXPECT_NE(slurp(z3 + ".log").find("optimizer: ZeRO-3, "), std::string::npos) << slurp(z3 + ".log");
  expect_same_run(z2, z3);
}

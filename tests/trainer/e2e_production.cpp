// The production path of `gmod train` in CI, a few steps on 2 ranks: configs/tiny_parts.json (stage 2
// composed from parts, bf16, ZeRO-2, frozen vision tower, ARank by the paper's protocol -> keep_top
// conversion, activation checkpointing, overlapped reduction) resumed across ZeRO stages, a NaN injected on
// one rank inside the trainer (GMOD_FAULT_INJECT, trainer/fault_injection.h), and max_consecutive_skipped
// aborting the run by name.
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/common/paths.h"
#include "tests/trainer/e2e_util.h"

namespace {

using json = nlohmann::json;
using namespace gmod::test;
using namespace gmod::e2e;

// `gmod train` on configs/tiny_parts.json with the fixture parts (np = 0: a plain process, else under
// mpirun); `env` (e.g. "GMOD_FAULT_INJECT=...") is set for every rank. Output appends to <run_dir>.log.
int tiny_parts(int np, const std::string& data_dir, const std::string& run_dir,
               const std::vector<std::string>& sets, const std::string& env = "") {
  const std::string src = source_dir();
  std::string cmd = env.empty() ? "" : "env " + env + " ";
  if (np > 0) {
    cmd += std::string(GMOD_MPIEXEC) + " " + GMOD_MPIEXEC_NP + " " + std::to_string(np) + " " +
           GMOD_MPIRUN_FLAGS;
    if (!env.empty()) cmd += " -x " + env.substr(0, env.find('='));
    cmd += " ";
  }
  cmd += std::string(GMOD_BIN) + " train --threads 1 --config " + src + "/configs/tiny_parts.json" +
         " --set model.llm=" + src + "/tests/fixtures/parts/llm --set model.vision=" + src +
         "/tests/fixtures/parts/vision --set model.projector=" + src +
         "/tests/fixtures/parts/mm_projector.bin" + " --set data.tokenizer=" + src +
         "/tests/fixtures/tokenizer/sp/tokenizer.model --set data.train=" + data_dir +
         "/train.json --set run_dir=" + run_dir + " --set metrics.log_every=1";
  for (const auto& s : sets) cmd += " --set '" + s + "'";
  cmd += " >> " + run_dir + ".log 2>&1";
  return run_shell(cmd);
}

// Saved at ZeRO-2 (the config's stage), resumed at ZeRO-1: the resharded optimizer state is bitwise the saved
// one (a load + save without training), and the continued run follows the uninterrupted ZeRO-2 run. At 2
// ranks both stages add the same two contributions (a + b is exact-order-free), so the weights, optimizer
// state and losses are bitwise equal; a difference means the resume or the stage switch lost something.
TEST(TrainProductionE2E, TinyPartsResumesAcrossZeroStages) {
  TempDir t;
  const std::string data = t.str("data"), u = t.str("uninterrupted"), s = t.str("stopped"),
                    r = t.str("reshard"), c = t.str("continued");
  const std::vector<std::string> six{"schedule.max_steps=6", "checkpoint.every=3"};
  auto with = [&](std::vector<std::string> v, const std::vector<std::string>& more) {
    v.insert(v.end(), more.begin(), more.end());
    return v;
  };
  ASSERT_EQ(tiny_parts(2, data, u, six), 0) << slurp(u + ".log");
  ASSERT_EQ(tiny_parts(2, data, s, with(six, {"schedule.exit_at_step=3"})), 0) << slurp(s + ".log");
  ASSERT_EQ(gmod::CheckpointReader(ckpt(s, 3)).config()["optimizer"]["zero_stage"], 2);
  EXPECT_NE(slurp(s + ".log").find("bf16"), std::string::npos);

  ASSERT_EQ(
      tiny_parts(2, data, r,
                 with(six, {"resume=" + ckpt(s, 3), "optimizer.zero_stage=1", "schedule.exit_at_step=3"})),
      0)
      << slurp(r + ".log");
  gmod::CheckpointReader resharded(ckpt(r, 3));
  EXPECT_EQ(resharded.config()["optimizer"]["zero_stage"], 1);
  {
    auto a = gmod::CheckpointReader(ckpt(s, 3)).read_model(), b = resharded.read_model();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bit_equal(a[i].second, b[i].second)) << a[i].first;
  }
  for (const char* n : {"master", "exp_avg", "exp_avg_sq"})
    EXPECT_TRUE(bit_equal(flat_optimizer(ckpt(s, 3), n), flat_optimizer(ckpt(r, 3), n))) << n;

  ASSERT_EQ(tiny_parts(2, data, c, with(six, {"resume=" + ckpt(s, 3), "optimizer.zero_stage=1"})), 0)
      << slurp(c + ".log");
  EXPECT_EQ(gmod::CheckpointReader(ckpt(c, 6)).config()["optimizer"]["zero_stage"], 1);
  const auto mu = step_metrics(u), mc = step_metrics(c);
  for (int64_t k = 4; k <= 6; ++k) {
    ASSERT_TRUE(mu.count(k) && mc.count(k)) << "step " << k;
    for (const char* f : {"loss", "lm_loss", "grad_norm", "lr"})
      EXPECT_EQ(mu.at(k)[f].dump(), mc.at(k)[f].dump()) << "step " << k << " " << f;
  }
  {
    auto a = gmod::CheckpointReader(ckpt(u, 6)).read_model(),
         b = gmod::CheckpointReader(ckpt(c, 6)).read_model();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bit_equal(a[i].second, b[i].second)) << a[i].first;
  }
  for (const char* n : {"master", "exp_avg", "exp_avg_sq"})
    EXPECT_TRUE(bit_equal(flat_optimizer(ckpt(u, 6), n), flat_optimizer(ckpt(c, 6), n))) << n;
}

// Optimizer offload (optimizer.offload: cpu) inside the trainer: a run offloaded to step 3 and resumed
// without offload, and a run saved without offload and resumed offloaded, both end bitwise where the
// never-offloaded run ends (weights and optimizer state at step 6, and the losses of steps 4-6): offloaded
// training is the same training, and its checkpoints move both ways.
TEST(TrainProductionE2E, TinyPartsOffloadIsBitwiseAndCheckpointsCrossOver) {
  TempDir t;
  const std::string data = t.str("data"), u = t.str("plain"), o = t.str("offloaded"),
                    a = t.str("off_then_on"), b = t.str("on_then_off");
  const std::vector<std::string> six{"schedule.max_steps=6", "checkpoint.every=3"};
  auto with = [&](std::vector<std::string> v, const std::vector<std::string>& more) {
    v.insert(v.end(), more.begin(), more.end());
    return v;
  };
  ASSERT_EQ(tiny_parts(2, data, u, six), 0) << slurp(u + ".log");
  ASSERT_EQ(tiny_parts(2, data, o, with(six, {"optimizer.offload=cpu", "schedule.exit_at_step=3"})), 0)
      << slurp(o + ".log");
  EXPECT_NE(slurp(o + ".log").find("offloaded to host memory"), std::string::npos);
  ASSERT_EQ(tiny_parts(2, data, a, with(six, {"resume=" + ckpt(o, 3)})), 0) << slurp(a + ".log");
  ASSERT_EQ(tiny_parts(2, data, b, with(six, {"resume=" + ckpt(u, 3), "optimizer.offload=cpu"})), 0)
      << slurp(b + ".log");
  const auto mu = step_metrics(u);
  for (const std::string& run : {a, b}) {
    const auto mr = step_metrics(run);
    for (int64_t k = 4; k <= 6; ++k) {
      ASSERT_TRUE(mu.count(k) && mr.count(k)) << run << " step " << k;
      for (const char* f : {"loss", "grad_norm"})
        EXPECT_EQ(mu.at(k)[f].dump(), mr.at(k)[f].dump()) << run << k << f;
    }
    auto x = gmod::CheckpointReader(ckpt(u, 6)).read_model(),
         y = gmod::CheckpointReader(ckpt(run, 6)).read_model();
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i)
      EXPECT_TRUE(bit_equal(x[i].second, y[i].second)) << run << x[i].first;
    for (const char* n : {"master", "exp_avg", "exp_avg_sq"})
      EXPECT_TRUE(bit_equal(flat_optimizer(ckpt(u, 6), n), flat_optimizer(ckpt(run, 6), n)))
          << run << " " << n;
  }
}

// A NaN gradient on rank 1 only, at step 2: every rank skips the update (rank 0, which writes the metrics,
// saw finite gradients of its own), the LR schedule holds, the skip counter is saved in the checkpoint and
// restored by a resume (which injects nothing).
TEST(TrainProductionE2E, TinyPartsNanOnOneRankIsSkippedByAllRanksAndCounted) {
  TempDir t;
  const std::string data = t.str("data"), run = t.str("nan");
  ASSERT_EQ(
      tiny_parts(2, data, run, {"schedule.max_steps=4", "schedule.exit_at_step=3", "checkpoint.every=0"},
                 "GMOD_FAULT_INJECT=nonfinite_grad:step=2,rank=1"),
      0)
      << slurp(run + ".log");
  std::string log = slurp(run + ".log");
  EXPECT_NE(log.find("fault injection: non-finite gradient on rank 1 at step 2"), std::string::npos) << log;
  EXPECT_EQ(log.find("non-finite gradient on rank 0"), std::string::npos) << log;
  EXPECT_NE(log.find("warning: step 2 skipped: non-finite gradient (1 in a row, 1 in total)"),
            std::string::npos)
      << log;
  auto m = step_metrics(run);
  ASSERT_EQ(m.size(), 3u) << log;
  EXPECT_FALSE(m.at(1)["skipped"].get<bool>());
  EXPECT_TRUE(m.at(2)["skipped"].get<bool>());
  EXPECT_FALSE(m.at(3)["skipped"].get<bool>());
  EXPECT_EQ(m.at(2)["skipped_total"], 1);
  EXPECT_EQ(m.at(3)["skipped_total"], 1);
  EXPECT_EQ(m.at(3)["lr"].dump(), m.at(2)["lr"].dump()) << "a skipped step does not advance the LR schedule";
  EXPECT_TRUE(std::isfinite(m.at(3)["loss"].get<double>()));
  gmod::CheckpointReader reader(ckpt(run, 3));
  EXPECT_EQ(reader.trainer_state()["skipped_total"], 1) << reader.trainer_state().dump();

  ASSERT_EQ(tiny_parts(2, data, run, {"schedule.max_steps=4", "checkpoint.every=0"}), 0)
      << slurp(run + ".log");
  m = step_metrics(run);
  ASSERT_TRUE(m.count(4));
  EXPECT_FALSE(m.at(4)["skipped"].get<bool>());
  EXPECT_EQ(m.at(4)["skipped_total"], 1) << "the counter is restored from the checkpoint";
  EXPECT_EQ(gmod::CheckpointReader(ckpt(run, 4)).trainer_state()["skipped_total"], 1);
}

// Three non-finite steps in a row with max_consecutive_skipped = 3: the run stops with the named error and a
// nonzero exit code on both ranks; the checkpoint it had before is intact.
TEST(TrainProductionE2E, TinyPartsMaxConsecutiveSkippedAborts) {
  TempDir t;
  const std::string data = t.str("data"), run = t.str("abort");
  const int rc =
      tiny_parts(2, data, run, {"schedule.max_steps=8", "checkpoint.every=1", "max_consecutive_skipped=3"},
                 "GMOD_FAULT_INJECT=nonfinite_grad:step=2,rank=0,count=5");
  const std::string log = slurp(run + ".log");
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(
      log.find(
          "step 4: 3 consecutive steps had non-finite gradients (max_consecutive_skipped = 3); aborting"),
      std::string::npos)
      << log;
  EXPECT_EQ(log.find("at step 5"), std::string::npos) << "the run should stop at step 4\n" << log;
  EXPECT_EQ(gmod::CheckpointManager::verify(ckpt(run, 3)), "")
      << log;  // the newest before the abort (keep_last 2)
  EXPECT_FALSE(std::filesystem::exists(ckpt(run, 4))) << log;
  auto m = step_metrics(run);
  EXPECT_FALSE(m.at(1)["skipped"].get<bool>());
  EXPECT_TRUE(m.at(2)["skipped"].get<bool>());
  EXPECT_TRUE(m.at(3)["skipped"].get<bool>());
}

// A malformed GMOD_FAULT_INJECT is a named error before anything runs, not a silently ignored variable.
TEST(TrainProductionE2E, BadFaultSpecIsANamedError) {
  TempDir t;
  const std::string data = t.str("data"), run = t.str("bad");
  const int rc = tiny_parts(0, data, run, {}, "GMOD_FAULT_INJECT=nonfinite_grad:step=x,rank=1");
  const std::string log = slurp(run + ".log");
  EXPECT_EQ(rc, 1) << log;
  EXPECT_NE(
      log.find("GMOD_FAULT_INJECT='nonfinite_grad:step=x,rank=1': step='x' is not a non-negative decimal"),
      std::string::npos)
      << log;
  EXPECT_FALSE(std::filesystem::exists(run + "/metrics.jsonl")) << log;
}

}  // namespace

// Failure handling of real `gmod train` jobs under mpirun (2 ranks, demo model, parallel.timeout_s = 5):
//   - kill -9 of one rank mid-training: every process is gone within the deadline + 30 s, the rank named;
//   - SIGSTOP of one rank: the watchdog of the other fires (no heartbeat / collective deadline), naming it;
//   - a full disk during a save (RLIMIT_FSIZE: writes fail with EFBIG) or a read-only checkpoint directory: a named
//     error, the previous checkpoint kept and resumed from;
//   - kill -9 of the whole job at random points of checkpoint saves: `resume auto` always finds a valid checkpoint
//     and the final weights equal those of an uninterrupted run (bench/kill_campaign.sh runs many more trials);
//   - the skipped-step counter survives a resume.
// Each test is its own ctest entry (CMakeLists.txt).
#include "tests/trainer/e2e_util.h"

#include <sys/stat.h>

#include <chrono>
#include <random>
#include <regex>
#include <thread>

namespace {

using namespace gmod::e2e;
using gmod::test::TempDir;
using Clock = std::chrono::steady_clock;

constexpr double kTimeout = 5.0;  // parallel.timeout_s in write_config

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Waits up to `limit` s for pid; kills it (and `ranks`) with SIGKILL if it is still there. Returns the exit status
// or -1 on timeout.
int wait_for(pid_t pid, double limit, const std::map<int, pid_t>& ranks = {}) {
  const auto t0 = Clock::now();
  int status = 0;
  while (since(t0) < limit) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (auto& [rank, p] : ranks) kill(p, SIGKILL);
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

// Starts a long 2-rank job and returns once it has logged `steps` steps: mpirun's pid and the ranks' pids.
struct Job {
  pid_t mpirun = -1;
  std::map<int, pid_t> ranks;
};
Job start_job(const std::string& cfg, int steps) {
  Job j;
  j.mpirun = spawn_shell("exec " + train_command(2, cfg, {"schedule.max_steps=100000"}));
  const std::string run = cfg.substr(0, cfg.size() - std::string(".config.json").size());
  const auto t0 = Clock::now();
  while (int(step_metrics(run, nullptr, true).size()) < steps && since(t0) < 120)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  j.ranks = rank_pids(j.mpirun);
  return j;
}

// mpirun has exited (status) and, within the deadline + 30 s of the fault at t0, so has every rank (mpirun's SIGKILLs
// may land a moment after mpirun itself is gone). Returns the seconds until the last process was gone.
double expect_all_gone(const Job& j, int status, Clock::time_point t0, const std::string& log) {
  EXPECT_NE(status, -1) << "job still running " << since(t0) << " s after the fault:\n" << log;
  if (status == -1) return since(t0);
  EXPECT_NE(exit_code(status), 0) << log;
  for (auto& [rank, pid] : j.ranks)
    while (alive(pid) && since(t0) < kTimeout + 30) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double s = since(t0);
  for (auto& [rank, pid] : j.ranks) EXPECT_FALSE(alive(pid)) << "rank " << rank << " pid " << pid << " survived";
  EXPECT_LT(s, kTimeout + 30) << log;
  return s;
}

}  // namespace

TEST(TrainFailures, KilledRankEndsTheJobNamingIt) {
  TempDir t;
  const std::string cfg = write_config(t.str("kill"));
  Job j = start_job(cfg, 2);
  ASSERT_EQ(j.ranks.size(), 2u) << slurp(cfg + ".log");
  const auto t0 = Clock::now();
  ASSERT_EQ(kill(j.ranks.at(1), SIGKILL), 0);
  const int status = wait_for(j.mpirun, kTimeout + 60, j.ranks);
  const std::string log = slurp(cfg + ".log");
  const double s = expect_all_gone(j, status, t0, log);
  // The ranks' own lines carry "[rank 1]": only mpirun's report says which rank died, and how.
  EXPECT_TRUE(
      std::regex_search(log, std::regex("process rank 1 with PID [0-9]+ on node \\S+ exited on signal 9")))
      << log;
  std::printf("kill -9 of rank 1: job gone after %.1f s\n", s);
}

TEST(TrainFailures, StoppedRankIsNamedByTheWatchdog) {
  TempDir t;
  const std::string cfg = write_config(t.str("stop"));
  Job j = start_job(cfg, 2);
  ASSERT_EQ(j.ranks.size(), 2u) << slurp(cfg + ".log");
  const auto t0 = Clock::now();
  ASSERT_EQ(kill(j.ranks.at(1), SIGSTOP), 0);
  const int status = wait_for(j.mpirun, kTimeout + 60, j.ranks);
  const std::string log = slurp(cfg + ".log");
  const double s = expect_all_gone(j, status, t0, log);
  EXPECT_NE(log.find("[rank 0] watchdog: "), std::string::npos) << log;
  const std::string where = ":" + std::to_string(j.ranks.at(1)) + "]";  // [host:pid] of rank 1
  const bool silent = log.find("no heartbeat from rank 1 [") != std::string::npos &&
                      log.find(where + " for") != std::string::npos;
  const bool missing = log.find("rank 1 [") != std::string::npos && log.find(where + " (no heartbeat for") != std::string::npos;
  EXPECT_TRUE(silent || missing) << log;
  EXPECT_GE(s, kTimeout - 1) << "fired before the deadline:\n" << log;
  std::printf("SIGSTOP of rank 1: job gone after %.1f s (timeout_s %.0f)\n", s, kTimeout);
}

// Runs `gmod train --config cfg` on 2 ranks whose writes past `ulimit -f 512` fail with EFBIG (256 KiB with dash's
// 512-byte blocks, 512 KiB with bash's; the optimizer shards are ~1 MB each, the metrics and config files a few
// KiB), output appended to cfg.log. Returns the wait status (-1: not started or not done in 180 s) and the job's
// part of the log.
static std::pair<int, std::string> train_with_small_file_limit(const std::string& cfg) {
  const size_t before = slurp(cfg + ".log").size();
  const std::string rank_cmd = "trap '' XFSZ; ulimit -f 512; exec " + std::string(GMOD_BIN) +
                               " train --threads 1 --config " + cfg;
  const std::string cmd = std::string("exec ") + GMOD_MPIEXEC + " " + GMOD_MPIEXEC_NP + " 2 " + GMOD_MPIRUN_FLAGS +
                          " --mca btl self,tcp /bin/sh -c \"" + rank_cmd + "\" >> " + cfg + ".log 2>&1";
  const pid_t pid = spawn_shell(cmd);
  const int status = pid > 0 ? wait_for(pid, 180) : -1;
  return {status, slurp(cfg + ".log").substr(before)};
}

// Writes past RLIMIT_FSIZE fail with EFBIG (SIGXFSZ ignored), a real failed write: the save of step 4 fails on a
// named file, the job ends non-zero, step 2 stays valid and `resume auto` continues from it to the same weights as an
// uninterrupted run. The limit is set for the ranks only (mpirun's PMIx store must not hit it), and they talk over
// TCP (the shared-memory transport's segment file would exceed it).
TEST(TrainFailures, FullDiskDuringSaveKeepsThePreviousCheckpoint) {
  TempDir t;
  const std::string run = t.str("full"), cfg = write_config(run, {{"schedule", {{"max_steps", 4}}}});
  ASSERT_EQ(gmod_train(2, cfg, {"schedule.exit_at_step=2"}), 0) << slurp(cfg + ".log");
  ASSERT_EQ(gmod::CheckpointManager::verify(ckpt(run, 2)), "");
  const auto [status, log] = train_with_small_file_limit(cfg);
  ASSERT_NE(status, -1) << log;
  EXPECT_NE(exit_code(status), 0) << log;
  EXPECT_NE(log.find("error: "), std::string::npos) << log;
  EXPECT_NE(log.find("File too large"), std::string::npos) << log;
  EXPECT_NE(log.find("step-4.tmp"), std::string::npos) << log;  // names the file being written
  if (const size_t e = log.find("error: "); e != std::string::npos)
    std::printf("full disk: %s\n", log.substr(e, log.find('\n', e) - e).c_str());
  EXPECT_FALSE(std::filesystem::exists(ckpt(run, 4)));
  EXPECT_EQ(gmod::CheckpointManager::verify(ckpt(run, 2)), "");

  ASSERT_EQ(gmod_train(2, cfg), 0) << slurp(cfg + ".log");
  EXPECT_NE(slurp(cfg + ".log").find("resume: " + ckpt(run, 2)), std::string::npos);
  const std::string ref = t.str("ref"), ref_cfg = write_config(ref, {{"schedule", {{"max_steps", 4}}}});
  ASSERT_EQ(gmod_train(2, ref_cfg), 0) << slurp(ref_cfg + ".log");
  expect_same_model(ckpt(run, 4), ckpt(ref, 4));
}

// checkpoint.async with a failing background write (RLIMIT_FSIZE, as above, from step 3 on): the save of step 3
// fails in the background, and the next poll ends the job with a named error on every rank (the step, the rank,
// the file, that step 2 is the last complete checkpoint); step 2 stays valid and `resume auto` continues from it to
// the uninterrupted run's weights.
TEST(TrainFailures, FailedAsyncSaveIsNamedAndKeepsThePreviousCheckpoint) {
  TempDir t;
  const json extra = {{"schedule", {{"max_steps", 4}}}, {"checkpoint", {{"every", 1}, {"keep_last", 0}, {"async", true}}}};
  const std::string run = t.str("full"), cfg = write_config(run, extra);
  ASSERT_EQ(gmod_train(2, cfg, {"schedule.exit_at_step=2"}), 0) << slurp(cfg + ".log");
  ASSERT_EQ(gmod::CheckpointManager::verify(ckpt(run, 2)), "");
  const auto [status, log] = train_with_small_file_limit(cfg);
  ASSERT_NE(status, -1) << log;
  EXPECT_NE(exit_code(status), 0) << log;
  EXPECT_NE(log.find("the background save of step 3 failed on rank "), std::string::npos) << log;
  EXPECT_NE(log.find("File too large"), std::string::npos) << log;
  EXPECT_NE(log.find("the last complete checkpoint is " + ckpt(run, 2)), std::string::npos) << log;
  if (const size_t e = log.find("error: "); e != std::string::npos)
    std::printf("failed async save: %s\n", log.substr(e, log.find('\n', e) - e).c_str());
  EXPECT_FALSE(std::filesystem::exists(ckpt(run, 3)));
  EXPECT_EQ(gmod::CheckpointManager::verify(ckpt(run, 2)), "");

  ASSERT_EQ(gmod_train(2, cfg), 0) << slurp(cfg + ".log");
  EXPECT_NE(slurp(cfg + ".log").find("resume: " + ckpt(run, 2)), std::string::npos);
  const std::string ref = t.str("ref"), ref_cfg = write_config(ref, {{"schedule", {{"max_steps", 4}}}});
  ASSERT_EQ(gmod_train(2, ref_cfg), 0) << slurp(ref_cfg + ".log");
  expect_same_model(ckpt(run, 4), ckpt(ref, 4));
}

// kill -9 of mpirun and every rank at a random moment while checkpoints are being written (checkpoint.every = 1);
// then `resume auto` until done. Every trial must end with the uninterrupted (synchronous) run's weights.
static void kill_whole_job_during_saves(bool async) {
  TempDir t;
  const json extra = {{"schedule", {{"max_steps", 6}}}, {"checkpoint", {{"every", 1}, {"keep_last", 2}}}};
  const std::string ref = t.str("ref"), ref_cfg = write_config(ref, extra);
  ASSERT_EQ(gmod_train(2, ref_cfg), 0) << slurp(ref_cfg + ".log");
  json trial_extra = extra;
  trial_extra["checkpoint"]["async"] = async;
  std::mt19937 rng(async ? 20261202 : 20261201);
  for (int trial = 0; trial < 2; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    const std::string run = t.str("trial" + std::to_string(trial)), cfg = write_config(run, trial_extra);
    const pid_t mpirun = spawn_shell("exec " + train_command(2, cfg));
    std::map<int, pid_t> ranks;
    const auto t0 = Clock::now();
    while (ranks.size() < 2 && since(t0) < 60) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ranks = rank_pids(mpirun);
    }
    ASSERT_EQ(ranks.size(), 2u) << slurp(cfg + ".log");
    // A save is in progress once step-N.tmp exists: spin until the save of step 3 or 4 starts, wait a random
    // 0-20 ms (about a save of this model) and SIGKILL everything.
    const int target = std::uniform_int_distribution<int>(3, 4)(rng);
    const std::string tmp = run + "/checkpoints/step-" + std::to_string(target) + ".tmp";
    bool saw = false;
    while (!(saw = std::filesystem::exists(tmp)) && since(t0) < 120) {
    }
    const auto t1 = Clock::now();
    // Trial 0 kills at once (inside the save for sure, checked below); later trials after a random delay.
    const int delay_ms = std::uniform_int_distribution<int>(0, 20)(rng);
    const double delay = trial == 0 ? 0.0 : delay_ms / 1000.0;
    while (since(t1) < delay) {
    }
    for (auto& [r, p] : ranks) kill(p, SIGKILL);
    kill(mpirun, SIGKILL);
    int status = 0;
    waitpid(mpirun, &status, 0);
    ASSERT_TRUE(saw) << slurp(cfg + ".log");
    for (auto& [r, p] : ranks)
      for (int i = 0; i < 100 && alive(p); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto found = gmod::CheckpointManager(run).find_latest_valid();
    ASSERT_TRUE(found.has_value()) << "no valid checkpoint after the kill";
    // Inside the save: it never finished, its .tmp dir was left behind.
    const bool inside = std::filesystem::exists(tmp);
    std::printf(
        "trial %d: killed %.0f ms after step-%d.tmp appeared (%s); newest valid checkpoint step-%lld\n",
        trial, delay * 1000, target, inside ? "inside its save" : "after its save",
        static_cast<long long>(found->step));
    if (trial == 0) {
      EXPECT_TRUE(inside) << "the kill of trial 0 must land inside the save of step " << target;
    }
    if (inside) {
      EXPECT_LT(found->step, target) << "the interrupted save of step " << target << " counted as valid";
    }
    ASSERT_EQ(gmod_train(2, cfg), 0) << slurp(cfg + ".log");
    EXPECT_NE(slurp(cfg + ".log").find("resume: " + found->path), std::string::npos);
    if (async) {
      EXPECT_NE(slurp(cfg + ".log").find("writing in the background"), std::string::npos);
    }
    expect_same_model(ckpt(run, 6), ckpt(ref, 6));
  }
}

TEST(TrainFailures, KillWholeJobDuringSaveResumesExactly) { kill_whole_job_during_saves(false); }

// The same with checkpoint.async: the kills land inside the background writes (step-N.tmp appears when the
// background thread starts writing), and the async run's checkpoints equal the synchronous run's.
TEST(TrainFailures, KillWholeJobDuringAsyncSaveResumesExactly) { kill_whole_job_during_saves(true); }

// The skipped-step counter is saved (trainer_state.skipped_total) and restored: a learning rate of 1e30 makes the
// weights overflow after the first update, so the following steps have non-finite gradients and are skipped; a run
// stopped at step 3 and resumed reports the same counts at every step as the uninterrupted run.
TEST(TrainFailures, SkippedStepCounterIsSavedAndResumed) {
  TempDir t;
  const json extra = {{"schedule", {{"max_steps", 5}}},
                      {"optimizer", {{"lr", 1e30}, {"warmup_steps", 0}, {"min_lr", 1e29}}},
                      {"checkpoint", {{"every", 1}, {"keep_last", 0}}}};
  const std::string u = t.str("uninterrupted"), u_cfg = write_config(u, extra);
  ASSERT_EQ(gmod_train(0, u_cfg), 0) << slurp(u_cfg + ".log");
  const auto mu = step_metrics(u);
  ASSERT_EQ(mu.size(), 5u);
  ASSERT_GT(mu.at(3)["skipped_total"].get<int64_t>(), 0) << "no step was skipped; the test needs skipped steps";
  const std::string s = t.str("stopped"), s_cfg = write_config(s, extra);
  ASSERT_EQ(gmod_train(0, s_cfg, {"schedule.exit_at_step=3"}), 0) << slurp(s_cfg + ".log");
  EXPECT_EQ(gmod::CheckpointReader(ckpt(s, 3)).trainer_state()["skipped_total"], mu.at(3)["skipped_total"]);
  ASSERT_EQ(gmod_train(0, s_cfg), 0) << slurp(s_cfg + ".log");
  const auto ms = step_metrics(s);
  for (int64_t k = 1; k <= 5; ++k) {
    EXPECT_EQ(ms.at(k)["skipped_total"], mu.at(k)["skipped_total"]) << "step " << k;
    EXPECT_EQ(ms.at(k)["skipped"], mu.at(k)["skipped"]) << "step " << k;
  }
  EXPECT_EQ(gmod::CheckpointReader(ckpt(s, 5)).trainer_state()["skipped_total"], mu.at(5)["skipped_total"]);
}

// A read-only checkpoint directory during a save (a read-only bind mount as root, else chmod 0555): the save of
// step 4 fails naming the directory, the job ends non-zero, and step 2 is kept and resumed from once it is writable.
TEST(TrainFailures, ReadOnlyRunDirDuringSaveKeepsThePreviousCheckpoint) {
  TempDir t;
  const std::string run = t.str("ro"), cfg = write_config(run, {{"schedule", {{"max_steps", 4}}}});
  ASSERT_EQ(gmod_train(2, cfg, {"schedule.exit_at_step=2"}), 0) << slurp(cfg + ".log");
  const std::string dir = run + "/checkpoints";
  struct ReadOnly {
    std::string dir;
    bool mounted = false;
    explicit ReadOnly(const std::string& d) : dir(d) {
      if (geteuid() == 0)
        mounted = std::system(("mount --bind '" + dir + "' '" + dir + "' 2>/dev/null && mount -o remount,bind,ro '" +
                               dir + "' '" + dir + "' 2>/dev/null").c_str()) == 0;
      if (!mounted) chmod(dir.c_str(), 0555);
    }
    ~ReadOnly() {
      if (mounted) (void)std::system(("umount '" + dir + "' 2>/dev/null").c_str());
      chmod(dir.c_str(), 0755);
    }
    bool works() const {
      const std::string probe = dir + "/probe";
      FILE* f = std::fopen(probe.c_str(), "w");
      if (!f) return true;
      std::fclose(f);
      std::remove(probe.c_str());
      return false;
    }
  };
  const std::string log0 = slurp(cfg + ".log");
  {
    ReadOnly ro(dir);
    if (!ro.works()) GTEST_SKIP() << "cannot make " << dir << " read-only here (root without mount rights?)";
    EXPECT_NE(gmod_train(2, cfg), 0);
    const std::string log = slurp(cfg + ".log").substr(log0.size());
    EXPECT_NE(log.find("error: "), std::string::npos) << log;
    EXPECT_NE(log.find("step-4.tmp"), std::string::npos) << log;
    EXPECT_TRUE(log.find("Read-only file system") != std::string::npos ||
                log.find("Permission denied") != std::string::npos)
        << log;
    if (const size_t e = log.find("error: "); e != std::string::npos)
      std::printf("read-only: %s\n", log.substr(e, log.find('\n', e) - e).c_str());
  }
  EXPECT_EQ(gmod::CheckpointManager::verify(ckpt(run, 2)), "");
  EXPECT_FALSE(std::filesystem::exists(ckpt(run, 4)));
  ASSERT_EQ(gmod_train(2, cfg), 0) << slurp(cfg + ".log");
  EXPECT_NE(slurp(cfg + ".log").find("resume: " + ckpt(run, 2)), std::string::npos);
  EXPECT_EQ(gmod::CheckpointManager::verify(ckpt(run, 4)), "");
}

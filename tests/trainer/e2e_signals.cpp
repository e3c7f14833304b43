// Stopping real `gmod train` jobs by signal (issue 19), 2 ranks, demo model, parallel.timeout_s = 5:
//   - SIGTERM to one rank only during training: every rank saves the checkpoint of the step and exits 0;
//   - SIGTERM to one rank only during set-up (right after the banner, while the model is loaded and converted): the
//     rank is not killed; the job ends cleanly (exit 0) with a message, or, when set-up was already over, saves;
//   - SIGTERM to launch/run_single_node.sh and to launch/run_multi_node.sh (as `kill`, Ctrl-C or `timeout` would):
//     the launcher turns it into the save signal for its ranks, a checkpoint is written, and the launcher and every
//     rank are gone within kBound seconds.
// SIGUSR1 to mpirun while an asynchronous checkpoint is being written in the background: the stop waits for it.
// And the rank-0 phases' own deadlines, on the ARank phase (GMOD_FAULT_INJECT slow_arank makes rank 0's ARank 8 s
// longer than parallel.timeout_s = 5 while rank 1 waits for its result; mod.rule keep_top:2 needs ARank): within
// parallel.arank_timeout_s the job trains; past it the watchdog names the phase and its key.
// Each test is its own ctest entry (CMakeLists.txt).
#include "tests/trainer/e2e_util.h"

#include <chrono>
#include <filesystem>
#include <thread>

namespace {

using namespace gmod::e2e;
using gmod::test::TempDir;
using Clock = std::chrono::steady_clock;

constexpr double kBound = 60.0;  // seconds from the signal until every process is gone

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Waits up to `limit` s for pid (SIGKILLs it and `others` after that); returns the status, or -1 on timeout.
int wait_for(pid_t pid, double limit, const std::map<int, pid_t>& others = {}) {
  const auto t0 = Clock::now();
  int status = 0;
  while (since(t0) < limit) {
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (auto& [r, p] : others) kill(p, SIGKILL);
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

// Polls until `pred` or `limit` s.
template <class F>
bool wait_until(F pred, double limit) {
  const auto t0 = Clock::now();
  while (!pred()) {
    if (since(t0) > limit) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// The ranks (OMPI_COMM_WORLD_RANK) among the descendants of `root`: mpirun's children, mpirun being `root` or a
// child of it (the launchers start mpirun in the background).
std::map<int, pid_t> find_ranks(pid_t root) {
  std::map<int, pid_t> r = rank_pids(root);
  if (!r.empty()) return r;
  DIR* d = opendir("/proc");
  if (!d) return r;
  while (dirent* e = readdir(d)) {
    const pid_t pid = pid_t(std::atoi(e->d_name));
    if (pid <= 0) continue;
    const std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream ss(stat.substr(close + 2));
    char state;
    pid_t ppid = 0;
    ss >> state >> ppid;
    if (ppid == root) {
      auto sub = rank_pids(pid);
      r.insert(sub.begin(), sub.end());
    }
  }
  closedir(d);
  return r;
}

std::vector<std::string> checkpoints(const std::string& run) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator(run + "/checkpoints", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) == 0 && name.find('.') == std::string::npos) out.push_back(e.path().string());
  }
  return out;
}

// Every pid in `ranks` gone (or a zombie) within what is left of kBound since t0.
void expect_ranks_gone(const std::map<int, pid_t>& ranks, Clock::time_point t0, const std::string& log) {
  for (auto& [rank, pid] : ranks) {
    while (alive(pid) && since(t0) < kBound) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_FALSE(alive(pid)) << "rank " << rank << " (pid " << pid << ") still running " << since(t0)
                             << " s after the signal\n" << log;
  }
}

// A launcher (or mpirun) running a long job; returns once `steps` steps are logged, with the ranks' pids.
struct Job {
  pid_t pid = -1;
  std::map<int, pid_t> ranks;
};
Job start(const std::string& command, const std::string& run, int steps) {
  Job j;
  j.pid = spawn_shell(command);
  wait_until([&] { return int(step_metrics(run, nullptr, true).size()) >= steps; }, 180);
  j.ranks = find_ranks(j.pid);
  return j;
}

// The signal reached a job at t0: it must exit 0 within kBound, every rank gone, a valid checkpoint of the last step.
void expect_saved_and_gone(const Job& j, Clock::time_point t0, const std::string& run, const std::string& log_path,
                           const char* what) {
  const int status = wait_for(j.pid, kBound, j.ranks);
  const std::string log = slurp(log_path);
  ASSERT_NE(status, -1) << what << " still running " << kBound << " s after SIGTERM:\n" << log;
  const double s = since(t0);
  EXPECT_EQ(exit_code(status), 0) << log;
  expect_ranks_gone(j.ranks, t0, log);
  const auto metrics = step_metrics(run);
  ASSERT_FALSE(metrics.empty()) << log;
  const int64_t last = metrics.rbegin()->first;
  EXPECT_EQ(gmod::CheckpointManager::verify(ckpt(run, last)), "") << log;
  EXPECT_NE(log.find("stopped by signal at step " + std::to_string(last)), std::string::npos) << log;
  std::printf("%s: SIGTERM -> checkpoint of step %lld, all gone after %.1f s\n", what, static_cast<long long>(last), s);
}

// One step with a conversion rule that needs ARank (on rank 0, in the ARank phase).
std::string arank_config(const std::string& run) {
  return write_config(run, {{"schedule", {{"max_steps", 1}}}, {"mod", {{"rule", "keep_top:2"}}}});
}

std::string long_config(const std::string& run) {
  return write_config(run, {{"schedule", {{"max_steps", 100000}}}, {"deterministic", false}});
}

}  // namespace

TEST(TrainSignals, TermToOneRankDuringTrainingSavesAndExitsZero) {
  TempDir t;
  const std::string run = t.str("one"), cfg = long_config(run);
  Job j = start("exec " + train_command(2, cfg), run, 2);
  ASSERT_EQ(j.ranks.size(), 2u) << slurp(cfg + ".log");
  const auto t0 = Clock::now();
  ASSERT_EQ(kill(j.ranks.at(1), SIGTERM), 0);  // rank 1 only: rank 0 learns it in the step's all-reduce
  expect_saved_and_gone(j, t0, run, cfg + ".log", "SIGTERM to rank 1");
}

TEST(TrainSignals, TermToOneRankDuringSetupEndsCleanly) {
  TempDir t;
  const std::string run = t.str("setup"), cfg = long_config(run), log = cfg + ".log";
  const pid_t pid = spawn_shell("exec " + train_command(2, cfg));
  // The banner is printed after the ranks' first exchange, before the model is loaded: rank 1 is in set-up.
  ASSERT_TRUE(wait_until([&] { return slurp(log).find("gmod train: 2 rank(s)") != std::string::npos; }, 120))
      << slurp(log);
  std::map<int, pid_t> ranks = rank_pids(pid);
  ASSERT_EQ(ranks.size(), 2u) << slurp(log);
  const bool before_training = step_metrics(run, nullptr, true).empty();
  const auto t0 = Clock::now();
  ASSERT_EQ(kill(ranks.at(1), SIGTERM), 0);
  const int status = wait_for(pid, kBound, ranks);
  const std::string out = slurp(log);
  ASSERT_NE(status, -1) << "job still running " << kBound << " s after SIGTERM:\n" << out;
  EXPECT_EQ(exit_code(status), 0) << "a signal during set-up must not kill the rank:\n" << out;
  EXPECT_EQ(out.find("exited on signal"), std::string::npos) << out;
  expect_ranks_gone(ranks, t0, out);
  const bool in_setup = out.find("stop signal received during set-up: stopping before step 1; nothing trained, no "
                                 "checkpoint written") != std::string::npos;
  EXPECT_TRUE(in_setup || out.find("stopped by signal at step") != std::string::npos) << out;
  if (in_setup) {
    EXPECT_TRUE(checkpoints(run).empty()) << out;
  }
  std::printf("SIGTERM to rank 1 %s set-up (%s): job ended cleanly after %.1f s\n",
              before_training ? "during" : "after", in_setup ? "stopped before step 1" : "saved", since(t0));
}

TEST(TrainSignals, TermToRunSingleNodeSavesAndEndsTheJob) {
  TempDir t;
  const std::string run = t.str("single"), cfg = long_config(run), log = cfg + ".log";
  const std::string launcher = gmod::test::source_dir() + "/launch/run_single_node.sh";
  Job j = start("GMOD_BIN=" + std::string(GMOD_BIN) + " GMOD_THREADS=1 exec " + launcher + " " + cfg + " 2 >> " +
                    log + " 2>&1",
                run, 2);
  ASSERT_EQ(j.ranks.size(), 2u) << slurp(log);
  const auto t0 = Clock::now();
  ASSERT_EQ(kill(j.pid, SIGTERM), 0);
  expect_saved_and_gone(j, t0, run, log, "run_single_node.sh");
  EXPECT_NE(slurp(log).find("run_single_node: SIGTERM -> SIGUSR1 to the ranks"), std::string::npos) << slurp(log);
}

TEST(TrainSignals, TermToRunMultiNodeSavesAndEndsTheJob) {
  TempDir t;
  const std::string run = t.str("multi"), cfg = long_config(run), log = cfg + ".log";
  const std::string hosts = t.str("hosts");
  std::ofstream(hosts) << "localhost slots=2\n";
  const std::string launcher = gmod::test::source_dir() + "/launch/run_multi_node.sh";
  Job j = start("GMOD_BIN=" + std::string(GMOD_BIN) +
                    " GMOD_THREADS=1 GMOD_MPIRUN_ARGS='--mca btl_vader_single_copy_mechanism none' exec " + launcher + " " + hosts + " 2 " + cfg + " >> " + log + " 2>&1",
                run, 2);
  ASSERT_EQ(j.ranks.size(), 2u) << slurp(log);
  const auto t0 = Clock::now();
  ASSERT_EQ(kill(j.pid, SIGTERM), 0);
  expect_saved_and_gone(j, t0, run, log, "run_multi_node.sh");
  EXPECT_NE(slurp(log).find("run_multi_node: SIGTERM -> SIGUSR1 to the ranks"), std::string::npos) << slurp(log);
}

// SIGUSR1 to mpirun while an asynchronous save is being written (issue 30): GMOD_FAULT_INJECT slow_save makes rank
// 1's background write of step 2 take 8 s longer, past parallel.timeout_s = 5, so the signal, sent as soon as rank 0
// prints "writing in the background", lands inside it. The stop must wait for that save (committed in full, then
// the stop step saved synchronously), exit 0, and a resume must end bitwise where an uninterrupted run ends.
TEST(TrainSignals, StopDuringAsyncSaveWaitsForItAndResumesBitwise) {
  TempDir t;
  const json extra = {{"schedule", {{"max_steps", 6}}}, {"checkpoint", {{"every", 2}, {"keep_last", 0}}}};
  json async_extra = extra;
  async_extra["checkpoint"]["async"] = true;
  const std::string run = t.str("async_stop"), cfg = write_config(run, async_extra), log = cfg + ".log";
  const pid_t pid =
      spawn_shell("exec env GMOD_FAULT_INJECT=slow_save:step=2,rank=1,seconds=8 " + train_command(2, cfg));
  ASSERT_TRUE(wait_until([&] { return slurp(log).find("writing in the background") != std::string::npos; }, 180))
      << slurp(log);
  const auto t0 = Clock::now();
  const std::map<int, pid_t> ranks = rank_pids(pid);
  ASSERT_EQ(kill(pid, SIGUSR1), 0);
  const int status = wait_for(pid, kBound, ranks);
  const double waited = since(t0);
  const std::string out = slurp(log);
  ASSERT_NE(status, -1) << "job still running " << kBound << " s after SIGUSR1:\n" << out;
  EXPECT_EQ(exit_code(status), 0) << out;
  EXPECT_NE(out.find("checkpoint: step 2 copied to host"), std::string::npos) << out;
  EXPECT_NE(out.find("the save of step 2 on rank 1 waits 8 s after writing its files"), std::string::npos) << out;
  EXPECT_EQ(out.find("watchdog:"), std::string::npos) << "a rank waiting for the slow one timed out:\n" << out;
  // The save in flight was finished and committed before the stop's own save.
  const auto metrics = step_metrics(run);
  ASSERT_FALSE(metrics.empty()) << out;
  const int64_t last = metrics.rbegin()->first;
  ASSERT_GT(last, 2) << out;
  ASSERT_LT(last, 6) << "the signal did not stop the run:\n" << out;
  const size_t background = out.find(ckpt(run, 2) + " (written in the background in ");
  const size_t final_save = out.find("checkpoint: " + ckpt(run, last) + " (");
  const size_t stopped = out.find("stopped by signal at step " + std::to_string(last));
  ASSERT_NE(background, std::string::npos) << out;
  EXPECT_NE(final_save, std::string::npos) << out;
  EXPECT_NE(stopped, std::string::npos) << out;
  EXPECT_LT(background, final_save) << out;
  EXPECT_LT(final_save, stopped) << out;
  // Rank 1's write still had about 8 s to go when the signal came: the job cannot have ended sooner.
  EXPECT_GT(waited, 5.0) << "the stop did not wait for the save in flight:\n" << out;
  EXPECT_EQ(gmod::CheckpointManager::verify(ckpt(run, 2)), "") << out;
  EXPECT_EQ(gmod::CheckpointManager::verify(ckpt(run, last)), "") << out;
  std::printf("SIGUSR1 during the async save of step 2: stopped at step %lld after %.1f s, both checkpoints valid\n",
              static_cast<long long>(last), waited);

  ASSERT_EQ(gmod_train(2, cfg), 0) << slurp(log);
  EXPECT_NE(slurp(log).find("resume: " + ckpt(run, last)), std::string::npos) << slurp(log);
  const std::string ref = t.str("async_stop_ref"), ref_cfg = write_config(ref, extra);
  ASSERT_EQ(gmod_train(2, ref_cfg), 0) << slurp(ref_cfg + ".log");
  expect_same_model(ckpt(run, 6), ckpt(ref, 6));
  EXPECT_EQ(step_metrics(run).at(6)["loss"].dump(), step_metrics(ref).at(6)["loss"].dump());
}

TEST(TrainSignals, ArankLongerThanTimeoutButWithinItsDeadlineTrains) {
  TempDir t;
  const std::string run = t.str("arank_ok"), cfg = arank_config(run);
  const int rc = run_shell("env GMOD_FAULT_INJECT=slow_arank:rank=0,seconds=8 " + train_command(2, cfg));
  const std::string log = slurp(cfg + ".log");
  EXPECT_EQ(rc, 0) << log;
  EXPECT_NE(log.find("ARank on rank 0 takes 8 s longer"), std::string::npos) << log;
  EXPECT_EQ(log.find("watchdog:"), std::string::npos) << log;
  EXPECT_EQ(gmod::CheckpointManager::verify(ckpt(run, 1)), "") << log;
}

TEST(TrainSignals, ArankPastItsDeadlineIsNamed) {
  TempDir t;
  const std::string run = t.str("arank_late"), cfg = arank_config(run);
  const auto t0 = Clock::now();
  const int rc = run_shell("env GMOD_FAULT_INJECT=slow_arank:rank=0,seconds=60 timeout 120 " +
                           train_command(2, cfg, {"parallel.arank_timeout_s=6"}));
  const std::string log = slurp(cfg + ".log");
  EXPECT_NE(rc, 0) << log;
  EXPECT_NE(rc, 124) << "hung until timeout(1):\n" << log;
  EXPECT_NE(log.find("[rank 1] watchdog: broadcast (MPI_Ibcast)"), std::string::npos) << log;
  EXPECT_NE(log.find("did not complete within parallel.arank_timeout_s = 6.0 s (the deadline of phase 'ARank on "
                     "rank 0 (the other ranks wait for its result)')"),
            std::string::npos)
      << log;
  EXPECT_LT(since(t0), 50.0) << log;
}

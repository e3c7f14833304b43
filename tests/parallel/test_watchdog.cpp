// The watchdog (parallel/watchdog.h) under mpirun with 3 ranks of helper_abort and a 2 s deadline: a rank that hangs
// alive, one that is SIGSTOPped and one that is SIGKILLed at step 5 must each end the whole job within the deadline
// + 30 s, non-zero, with the rank named; a healthy job whose ranks finish at different times exits 0.
#include <gtest/gtest.h>

#include "tests/common/run_command.h"

#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <regex>
#include <string>

namespace {

using Result = gmod::test::CommandResult;
using gmod::test::run_command;

constexpr double kTimeout = 2.0;

Result watch(const std::string& mode) {
  return run_command(std::string("timeout 120 ") + GMOD_MPIEXEC + " -np 3 " + GMOD_MPIRUN_FLAGS + " " + GMOD_ABORT_HELPER +
             " watch_" + mode + " " + std::to_string(kTimeout));
}

// "[host:pid]" of the misbehaving rank as the watchdog names it (the helper prints "rank 2 (pid N)").
std::string where_rank2(const Result& r) {
  std::smatch m;
  if (!std::regex_search(r.out, m, std::regex("helper: rank 2 \\(pid ([0-9]+)\\)"))) return "<no pid printed>";
  return ":" + m[1].str() + "]";
}

void expect_aborted_in_time(const Result& r) {
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.code, 124) << "job hung until timeout(1):\n" << r.out;
  EXPECT_LT(r.seconds, kTimeout + 30) << r.out;
}

}  // namespace

TEST(Watchdog, RanksFinishingAtDifferentTimesIsNotAFailure) {
  Result r = watch("ok");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("watch done world 3 heartbeat on"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("watchdog:"), std::string::npos) << r.out;
}

// Rank 2 is alive (its heartbeat says so) but never joins the all-reduce of step 5: ranks 0 and 1 time out in it and
// say where rank 2 is.
TEST(Watchdog, HungRankNamedWhenCollectiveTimesOut) {
  Result r = watch("hang");
  expect_aborted_in_time(r);
  EXPECT_NE(r.out.find("watchdog: all_reduce (MPI_Iallreduce), collective #"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("did not complete within parallel.timeout_s = 2.0 s at step 5"), std::string::npos) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("ranks missing from it: rank 2 \\[[^\\]]+\\] \\(alive at step 5, "
                                                  "not in a collective")))
      << r.out;
  EXPECT_NE(r.out.find(where_rank2(r) + " (alive"), std::string::npos) << r.out;
}

// Rank 2 stops (SIGSTOP: its heartbeat thread too): the others name it as silent.
TEST(Watchdog, StoppedRankNamedAsSilent) {
  Result r = watch("stop");
  expect_aborted_in_time(r);
  const std::string where = where_rank2(r);
  const bool collective = r.out.find(where + " (no heartbeat for") != std::string::npos;
  const bool heartbeat = r.out.find("no heartbeat from rank 2 [") != std::string::npos &&
                         r.out.find(where + " for") != std::string::npos;
  EXPECT_TRUE(collective || heartbeat) << r.out;
}

// Rank 2 dies: mpirun notices at once and ends the job, naming the rank.
TEST(Watchdog, KilledRankEndsJobNamingIt) {
  Result r = watch("kill");
  expect_aborted_in_time(r);
  // The helper prints "rank 2 (pid N)" itself: only mpirun's report names the rank that died and the signal.
  EXPECT_TRUE(
      std::regex_search(r.out, std::regex("process rank 2 with PID [0-9]+ on node \\S+ exited on signal 9")))
      << r.out;
}

// The watchdog's bounds (issue 19), under mpirun with helper_watchdog and a 2 s deadline:
//   - a failure whose communicator abort blocks for ever (a registered client stuck in MPI_Recv, as ncclCommAbort can
//     be) still ends every rank within the deadline + the abort bound (3 s) + a margin;
//   - a rank that never joins the set-up exchange gmod train uses for its banner (all_gather_strings, once a blocking
//     MPI_Gather) ends the job within the deadline, naming the exchange;
//   - a phase with its own deadline lets rank 0 work longer than parallel.timeout_s, and past the phase's deadline
//     the message names the phase and its key.
#include <gtest/gtest.h>

#include "tests/common/run_command.h"

#include <string>

namespace {

using Result = gmod::test::CommandResult;
using gmod::test::run_command;

constexpr double kTimeout = 2.0;

Result helper(int np, const std::string& args) {
  return run_command(std::string("timeout 120 ") + GMOD_MPIEXEC + " -np " + std::to_string(np) + " " +
                     GMOD_MPIRUN_FLAGS + " " + GMOD_WATCHDOG_HELPER + " " + args);
}

bool has(const Result& r, const std::string& s) { return r.out.find(s) != std::string::npos; }

}  // namespace

TEST(WatchdogBounds, BlockingCommunicatorAbortDoesNotStopTheJobFromEnding) {
  const Result r = helper(3, "abort_hangs " + std::to_string(kTimeout));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.code, 124) << "job hung in the communicator abort until timeout(1):\n" << r.out;
  EXPECT_TRUE(has(r, "helper: abort() of the blocking client entered")) << r.out;
  EXPECT_TRUE(has(r, "did not complete within parallel.timeout_s = 2.0 s at step 5")) << r.out;
  EXPECT_TRUE(has(r, "aborting the communicators did not finish within 3.0 s; ending the job without them")) << r.out;
  EXPECT_LT(r.seconds, kTimeout + 3.0 + 25) << r.out;
  std::printf("abort blocked for ever: job gone after %.1f s (deadline 2 s, abort bound 3 s)\n", r.seconds);
}

TEST(WatchdogBounds, RankThatNeverJoinsTheSetupGatherEndsTheJob) {
  const Result r = helper(2, "gather_missing " + std::to_string(kTimeout));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.code, 124) << "job hung in the gather until timeout(1):\n" << r.out;
  EXPECT_TRUE(has(r, "[rank 0] watchdog: test gather (MPI_Iallgatherv), collective #1 of communicator 0 did not "
                     "complete within parallel.timeout_s = 2.0 s"))
      << r.out;
  EXPECT_LT(r.seconds, kTimeout + 25) << r.out;
}

TEST(WatchdogBounds, PhaseLongerThanTimeoutButWithinItsOwnDeadlinePasses) {
  const Result r = helper(2, "phase " + std::to_string(kTimeout) + " 20 5");  // 5 s of work > 2 s, < 20 s
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(has(r, "phase done world 2")) << r.out;
  EXPECT_FALSE(has(r, "watchdog:")) << r.out;
}

TEST(WatchdogBounds, PhasePastItsDeadlineIsNamed) {
  const Result r = helper(2, "phase " + std::to_string(kTimeout) + " 4 60");  // 60 s of work > 4 s
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.code, 124) << r.out;
  EXPECT_TRUE(has(r, "[rank 1] watchdog: broadcast (MPI_Ibcast), collective #")) << r.out;
  EXPECT_TRUE(has(r, "did not complete within parallel.test_phase_timeout_s = 4.0 s (the deadline of phase 'test "
                     "phase (rank 0 works, the others wait)')"))
      << r.out;
  EXPECT_TRUE(has(r, "rank 0 [")) << r.out;  // where the missing rank is
  EXPECT_LT(r.seconds, 4 + 25) << r.out;
}

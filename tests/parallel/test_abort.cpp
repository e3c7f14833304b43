// Runs helper_abort under mpirun: a rank that throws must end the whole job promptly with a non-zero exit code and
// a message naming the rank; a healthy job (and an MPI singleton without mpirun) exits 0.
#include <gtest/gtest.h>

#include "tests/common/run_command.h"

#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <string>

namespace {

using Result = gmod::test::CommandResult;
using gmod::test::run_command;

std::string mpirun(int np, const std::string& mode) {
  return std::string("timeout 120 ") + GMOD_MPIEXEC + " -np " + std::to_string(np) + " " + GMOD_MPIRUN_FLAGS + " " +
         GMOD_ABORT_HELPER + " " + mode;
}

}  // namespace

TEST(RunGuarded, ThrowingRankAbortsJobWithRankTaggedMessage) {
  Result r = run_command(mpirun(3, "throw"));
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.code, 124) << "job hung until timeout:\n" << r.out;
  EXPECT_NE(r.out.find("[rank 2] error: deliberate failure in helper_abort"), std::string::npos) << r.out;
  EXPECT_LT(r.seconds, 60.0);
}

TEST(RunGuarded, HealthyJobExitsZero) {
  Result r = run_command(mpirun(2, "ok"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("ok world 2 sum 2"), std::string::npos) << r.out;
}

TEST(RunGuarded, SingletonWithoutMpirun) {
  Result r = run_command(std::string("timeout 120 ") + GMOD_ABORT_HELPER + " ok");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("ok world 1 sum 1"), std::string::npos) << r.out;
}

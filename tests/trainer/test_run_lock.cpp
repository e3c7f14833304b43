// The run-dir lock: a second holder fails at once naming the first (pid, host), the lock is released with its holder,
// and a holder in another process (here flock(1), as a shell would hold it) blocks it too.
#include "trainer/checkpoint/run_lock.h"

#include "tests/common/paths.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>

using gmod::RunDirLock;
using gmod::RunDirLocked;

TEST(RunLock, SecondHolderFailsNamingTheFirst) {
  gmod::test::TempDir t;
  const std::string run = t.str("a/b/run");  // created, parents included
  {
    RunDirLock first(run);
    EXPECT_EQ(first.path(), run + "/.lock");
    const std::string holder = RunDirLock::read_holder(first.path());
    EXPECT_EQ(holder.rfind("pid " + std::to_string(::getpid()) + " on host ", 0), 0u) << holder;
    try {
      RunDirLock second(run);
      ADD_FAILURE() << "second lock taken";
    } catch (const RunDirLocked& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("run_dir " + run + " is in use by another job (pid " + std::to_string(::getpid())), std::string::npos)
          << w;
      EXPECT_NE(w.find("lock file " + run + "/.lock"), std::string::npos) << w;
    }
  }
  RunDirLock again(run);  // released with its holder; the stale file does not block
  SUCCEED();
}

TEST(RunLock, HolderInAnotherProcessBlocksAndReleasesOnExit) {
  if (std::system("command -v flock >/dev/null 2>&1") != 0) GTEST_SKIP() << "flock(1) not installed";
  gmod::test::TempDir t;
  const std::string run = t.str("run");
  ::mkdir(run.c_str(), 0755);
  std::ofstream(run + "/.lock") << "pid 4242 on host elsewhere since then, user x: gmod train\n";
  // flock(1) holds the lock while `sleep` runs, then exits and the kernel releases it.
  const std::string ready = t.str("ready");
  const std::string cmd = "flock -n " + run + "/.lock sh -c 'touch " + ready + "; sleep 2' &";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  for (int i = 0; i < 200 && ::access(ready.c_str(), F_OK) != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(::access(ready.c_str(), F_OK), 0);
  try {
    RunDirLock l(run);
    ADD_FAILURE() << "lock taken while flock(1) holds it";
  } catch (const RunDirLocked& e) {
    EXPECT_NE(std::string(e.what()).find("(pid 4242 on host elsewhere"), std::string::npos) << e.what();
  }
  bool taken = false;
  for (int i = 0; i < 100 && !taken; ++i) {
    try {
      RunDirLock l(run);
      taken = true;
    } catch (const RunDirLocked&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  EXPECT_TRUE(taken);
}

TEST(RunLock, UnusableRunDirIsNamed) {
  gmod::test::TempDir t;
  std::ofstream(t.str("file")) << "x";
  try {
    RunDirLock l(t.str("file"));
    ADD_FAILURE();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(t.str("file") + " is not a directory"), std::string::npos) << e.what();
  }
}

// The exclusive lock of a run directory, so that two jobs never train into the same run_dir (the second would resume
// from the first's live checkpoint and both would delete each other's temporary files). It is an flock(2) on
// <run_dir>/.lock, taken without waiting: the kernel releases it when the holder exits, however it exits (kill -9,
// a node crash on local disks), so a stale lock file never blocks a later job. The holder writes who it is into the
// file (pid, host, start time, user, command), and a second job fails at once naming it.
//
// On NFS (v4, or v3 with lockd) Linux implements flock with byte-range locks that the server arbitrates, so the lock
// holds across nodes; file systems that do not support locks at all (Lustre mounted without -o flock) fail with a
// message saying so rather than running unprotected.
#pragma once

#include <stdexcept>
#include <string>

namespace gmod {

// Another process holds the lock; what() names the run dir, the lock file and the holder.
struct RunDirLocked : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class RunDirLock {
 public:
  // Creates run_dir when missing, then takes the lock or throws RunDirLocked (held by another job) or
  // std::runtime_error (cannot create or lock the file, naming it and the system's reason).
  explicit RunDirLock(const std::string& run_dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

  const std::string& path() const { return path_; }
  // What the file says about the holder: "pid 123 on host n1 since 2026-12-01T08:00:00Z, user u: gmod train".
  static std::string read_holder(const std::string& lock_path);

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace gmod

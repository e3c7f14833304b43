// flock on <run_dir>/.lock with the holder's identity written into the file; see run_lock.h.
#include "trainer/checkpoint/run_lock.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

namespace gmod {
namespace {

std::string errno_text(int e) { return std::strerror(e); }

// mkdir -p without std::filesystem (whose tree functions are unreliable next to the torch wheel).
void make_dirs(const std::string& dir) {
  std::string cur;
  size_t i = 0;
  while (i <= dir.size()) {
    const size_t j = std::min(dir.find('/', i), dir.size());
    cur = dir.substr(0, j);
    if (!cur.empty() && ::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
      throw std::runtime_error("run_dir: cannot create " + cur + ": " + errno_text(errno));
    i = j + 1;
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw std::runtime_error("run_dir: " + dir + " is not a directory");
}

std::string holder_text() {
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
  char when[64] = "?";
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  if (gmtime_r(&now, &tm)) std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  std::string user = "?";
  if (const passwd* pw = ::getpwuid(::geteuid())) user = pw->pw_name;
  std::string cmd;
  std::ifstream cl("/proc/self/cmdline", std::ios::binary);
  for (std::string arg; std::getline(cl, arg, '\0');) cmd += (cmd.empty() ? "" : " ") + arg;
  if (cmd.size() > 400) cmd = cmd.substr(0, 400) + "...";
  return "pid " + std::to_string(::getpid()) + " on host " + host + " since " + when + ", user " + user +
         (cmd.empty() ? "" : ": " + cmd);
}

}  // namespace

std::string RunDirLock::read_holder(const std::string& lock_path) {
  std::ifstream in(lock_path);
  std::string line;
  std::getline(in, line);
  return line.empty() ? "a process that has not written its name yet" : line;
}

RunDirLock::RunDirLock(const std::string& run_dir) {
  if (run_dir.empty()) throw std::runtime_error("run_dir: empty path");
  make_dirs(run_dir);
  path_ = run_dir + (run_dir.back() == '/' ? "" : "/") + ".lock";
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error("run_dir: cannot open the lock file " + path_ + ": " + errno_text(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    ::close(fd_);
    fd_ = -1;
    if (e == EWOULDBLOCK)
      throw RunDirLocked("run_dir " + run_dir + " is in use by another job (" + read_holder(path_) +
                         "; lock file " + path_ + "): two jobs on one run_dir would overwrite each other's "
                         "checkpoints. Wait for it to end, stop it, or choose another run_dir");
    throw std::runtime_error("run_dir: cannot lock " + path_ + ": " + errno_text(e) +
                             (e == ENOLCK || e == EINVAL || e == EOPNOTSUPP
                                  ? " (the file system does not support flock; e.g. mount Lustre with -o flock)"
                                  : ""));
  }
  // Ours now: say who holds it (a later job prints this line).
  const std::string text = holder_text() + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) != ssize_t(text.size())) {
    const int e = errno;
    ::close(fd_);
    fd_ = -1;
    throw std::runtime_error("run_dir: cannot write the lock file " + path_ + ": " + errno_text(e));
  }
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock; the file stays (its content is only informative)
}

}  // namespace gmod

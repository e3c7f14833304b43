// A file descriptor closed when it goes out of scope (the checkpoint readers' and writers' error paths
// throw).
#pragma once

#include <unistd.h>

namespace gmod {

struct UniqueFd {
  int fd = -1;
  UniqueFd() = default;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace gmod

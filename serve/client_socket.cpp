#include "serve/client_socket.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>

namespace gmod::serve {

namespace {

// "address", port of a socket end; false when it is not an IP socket.
bool end_of(int fd, bool peer, std::string& addr, int& port) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  const int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len)
                      : getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  if (rc != 0 || (ss.ss_family != AF_INET && ss.ss_family != AF_INET6)) return false;
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  addr = host;
  port = std::atoi(serv);
  return true;
}

}  // namespace

ClientSocket::ClientSocket(const std::string& local_addr, int local_port, const std::string& remote_addr,
                           int remote_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    std::string a;
    int p = 0;
    if (!end_of(fd, true, a, p) || p != remote_port || a != remote_addr) continue;
    if (!end_of(fd, false, a, p) || p != local_port || (!local_addr.empty() && a != local_addr)) continue;
    fd_ = fd;
    break;
  }
  closedir(dir);
}

bool ClientSocket::gone() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  char c;
  // Readable: either more request bytes (pipelining; not gone) or end of stream (gone).
  return recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

}  // namespace gmod::serve

// `gmod serve`: noticing that a client has gone while its request waits in the queue or decodes. cpp-httplib
// 0.11 (Debian 12) does not hand a handler its connection, so the accepted socket is found by its two ends
// (the request's local and remote address and port) among this process's descriptors; the socket stays open
// while the handler runs. A peer that closed (FIN or RST) reads as gone; a client that only reads slowly does
// not (slow readers are cut by the server's write timeout instead).
#pragma once

#include <string>

namespace gmod::serve {

class ClientSocket {
 public:
  ClientSocket() = default;
  // Finds the connection local_addr:local_port <-> remote_addr:remote_port; fd -1 when none matches (then
  // gone() is always false).
  ClientSocket(const std::string& local_addr, int local_port, const std::string& remote_addr,
               int remote_port);
  bool found() const { return fd_ >= 0; }
  // True when the peer has closed its side or the connection failed. Does not read request bytes.
  bool gone() const;

 private:
  int fd_ = -1;
};

}  // namespace gmod::serve

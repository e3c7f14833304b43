#include "parallel/watchdog.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

namespace gmod {
namespace {

constexpr int kTag = 4242;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string fmt_s(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f s", s);
  return b;
}

// What one rank tells the others, once per heartbeat period (64 bytes).
struct Beat {
  int64_t step = 0;
  int64_t seq = 0;      // collective it waits in / last waited in
  int32_t comm = 0;
  int32_t waiting = 0;  // 1 while blocked in a collective
  int32_t bye = 0;      // 1: leaving the job (watchdog_stop)
  int32_t pad = 0;
  char what[32] = {0};
};
static_assert(sizeof(Beat) == 64, "heartbeat message size");

struct Peer {
  double last_seen = 0;
  Beat beat;
  bool heard = false;
  bool bye = false;
};

struct State {
  std::atomic<double> timeout{600.0};
  std::atomic<double> abort_s{10.0};
  // The innermost PhaseDeadline (phase == nullptr: none).
  std::mutex phase_mu;
  const char* phase = nullptr;
  const char* phase_key = nullptr;
  double phase_timeout = 0;
  std::atomic<int64_t> step{0};
  std::atomic<int> comm_counter{0};
  std::atomic<bool> failing{false};

  // What this rank's main thread is blocked in (the last collective waited in when not waiting).
  std::mutex wait_mu;
  bool waiting = false;
  bool polled = false;  // the waiter enforces the deadline itself
  CollectiveId wait_id;
  double wait_since = 0;
  double wait_timeout = 0;  // the deadline in force when the wait began (a phase's, or timeout)
  std::string wait_deadline;

  // Heartbeat and watchdog thread.
  std::mutex mu;  // peers
  std::vector<Peer> peers;
  std::vector<std::string> where;  // per rank "host:pid", gathered at start
  MPI_Comm hb = MPI_COMM_NULL;
  int rank = 0, world = 1;
  double period = 1.0;
  bool heartbeat = false;
  std::string heartbeat_off = "watchdog not started";
  std::thread thread;
  std::atomic<bool> stop{false};
  bool running = false;

  std::mutex clients_mu;
  std::vector<WatchdogClient*> clients;
};

// Leaked on purpose: usable from the terminate handler and while statics are destroyed.
State& st() {
  static State* s = new State;
  return *s;
}

int my_rank() {
  int inited = 0, fin = 0, r = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&fin);
  if (inited && !fin) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

std::string mpi_error(int rc) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return std::string(msg, size_t(len));
}

Beat my_beat(bool bye) {
  State& s = st();
  Beat b;
  b.step = s.step.load();
  b.bye = bye ? 1 : 0;
  std::lock_guard<std::mutex> lock(s.wait_mu);
  b.waiting = s.waiting ? 1 : 0;
  b.comm = s.wait_id.comm;
  b.seq = s.wait_id.seq;
  std::strncpy(b.what, s.wait_id.what ? s.wait_id.what : "", sizeof b.what - 1);
  return b;
}

// The watchdog thread: heartbeats, silent peers, unpolled waits, clients.
void loop() {
  State& s = st();
  const int world = s.world, me = s.rank;
  std::vector<Beat> out(static_cast<size_t>(world));
  std::vector<MPI_Request> sreq(static_cast<size_t>(world), MPI_REQUEST_NULL);
  Beat in;
  MPI_Request rreq = MPI_REQUEST_NULL;
  auto post_recv = [&] {
    const int rc = MPI_Irecv(&in, sizeof(Beat), MPI_BYTE, MPI_ANY_SOURCE, kTag, s.hb, &rreq);
    if (rc != MPI_SUCCESS) watchdog_fail("heartbeat: MPI_Irecv failed: " + mpi_error(rc));
  };
  auto send_all = [&](bool bye) {
    const Beat b = my_beat(bye);
    for (int r = 0; r < world; ++r) {
      if (r == me) continue;
      if (sreq[r] != MPI_REQUEST_NULL) {
        int done = 0;
        MPI_Test(&sreq[r], &done, MPI_STATUS_IGNORE);
        if (!done) {
          if (!bye) continue;  // the previous beat is still on its way (a stopped peer): do not pile up
          MPI_Request_free(&sreq[r]);
        }
      }
      out[r] = b;
      const int rc = MPI_Isend(&out[r], sizeof(Beat), MPI_BYTE, r, kTag, s.hb, &sreq[r]);
      if (rc != MPI_SUCCESS)
        watchdog_fail("heartbeat to rank " + std::to_string(r) + " failed: " + mpi_error(rc));
    }
  };
  if (s.heartbeat) post_recv();
  double next_send = 0;
  const double tick = std::min(0.05, s.period / 4);
  while (!s.stop.load()) {
    // Another thread is ending the job: keep the heartbeat going (peers must not report this rank silent while it
    // aborts), but judge nothing and touch no client (they are being aborted).
    const bool failing = s.failing.load();
    const double t = now_s();
    const double timeout = s.timeout.load();
    if (s.heartbeat) {
      if (t >= next_send) {
        send_all(false);
        next_send = t + s.period;
      }
      for (;;) {
        int flag = 0;
        MPI_Status status;
        const int rc = MPI_Test(&rreq, &flag, &status);
        if (rc != MPI_SUCCESS) watchdog_fail("heartbeat: MPI_Test failed: " + mpi_error(rc));
        if (!flag) break;
        {
          std::lock_guard<std::mutex> lock(s.mu);
          Peer& p = s.peers[size_t(status.MPI_SOURCE)];
          p.last_seen = now_s();
          p.beat = in;
          p.heard = true;
          if (in.bye) p.bye = true;
        }
        post_recv();
      }
      int silent = -1;
      double age = 0;
      {
        std::lock_guard<std::mutex> lock(s.mu);
        for (int r = 0; r < world; ++r)
          if (r != me && !s.peers[r].bye && t - s.peers[r].last_seen > timeout) {
            silent = r;
            age = t - s.peers[r].last_seen;
            break;
          }
      }
      if (silent >= 0 && !failing)
        watchdog_fail("no heartbeat from rank " + std::to_string(silent) + " [" + s.where[size_t(silent)] + "] for " +
                    fmt_s(age) +
                      " (parallel.timeout_s = " + fmt_s(timeout) + "): it is stopped, hung or dead");
    }
    {
      bool late = false;
      CollectiveId id;
      double since = 0;
      std::string deadline;
      {
        std::lock_guard<std::mutex> lock(s.wait_mu);
        // The self-polling waiter reports first; this is the backstop 5 s later (a waiter that stopped polling).
        const double grace = s.polled ? 5.0 : 0.0;
        if (s.waiting && t - s.wait_since > s.wait_timeout + grace) {
          late = true;
          id = s.wait_id;
          since = s.wait_since;
          deadline = s.wait_deadline;
        }
      }
      if (late && !failing)
        watchdog_fail(describe(id) + " did not complete within " + deadline + " (waited " + fmt_s(t - since) + ")",
                      &id);
    }
    std::string problem;
    if (!failing) {
      std::lock_guard<std::mutex> lock(s.clients_mu);
      for (WatchdogClient* c : s.clients)
        if (problem.empty()) problem = c->poll(timeout);
    }
    if (!problem.empty()) watchdog_fail(problem);
    std::this_thread::sleep_for(std::chrono::duration<double>(tick));
  }
  if (!s.heartbeat) return;
  // Leaving: tell every peer, give the messages a moment, then drop what is left (a stopped peer never reads).
  send_all(true);
  const double until = now_s() + 2.0;
  for (int r = 0; r < world; ++r) {
    while (sreq[r] != MPI_REQUEST_NULL && now_s() < until) {
      int done = 0;
      MPI_Test(&sreq[r], &done, MPI_STATUS_IGNORE);
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (sreq[r] != MPI_REQUEST_NULL) MPI_Request_free(&sreq[r]);
  }
  MPI_Cancel(&rreq);
  MPI_Wait(&rreq, MPI_STATUS_IGNORE);
}

void set_wait(const CollectiveId& id, bool polled, double since, double timeout) {
  State& s = st();
  std::string deadline = deadline_text();
  std::lock_guard<std::mutex> lock(s.wait_mu);
  s.waiting = true;
  s.polled = polled;
  s.wait_id = id;
  s.wait_since = since;
  s.wait_timeout = timeout;
  s.wait_deadline = std::move(deadline);
}

void clear_wait() {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.wait_mu);
  s.waiting = false;
}

}  // namespace

void unblock_output_pipes() {
  for (int fd : {1, 2}) {
    struct stat sb;
    if (fstat(fd, &sb) == 0 && S_ISFIFO(sb.st_mode)) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
}

std::string describe(const CollectiveId& id) {
  return std::string(id.what) + ", collective #" + std::to_string(id.seq) + " of communicator " +
         std::to_string(id.comm);
}

double collective_timeout() {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.phase_mu);
  return s.phase ? s.phase_timeout : s.timeout.load();
}

std::string deadline_text() {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.phase_mu);
  if (!s.phase) return "parallel.timeout_s = " + fmt_s(s.timeout.load());
  return std::string(s.phase_key) + " = " + fmt_s(s.phase_timeout) + " (the deadline of phase '" + s.phase + "')";
}

void set_abort_bound(double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds))
    throw std::invalid_argument("parallel/watchdog: abort bound " + std::to_string(seconds) + ", expected > 0");
  st().abort_s.store(seconds);
}

PhaseDeadline::PhaseDeadline(const char* phase, const char* key, double timeout_s) {
  if (!(timeout_s > 0) || !std::isfinite(timeout_s))
    throw std::invalid_argument(std::string(key) + ": " + std::to_string(timeout_s) + ", expected a finite value > 0");
  State& s = st();
  std::lock_guard<std::mutex> lock(s.phase_mu);
  prev_phase_ = s.phase, prev_key_ = s.phase_key, prev_timeout_ = s.phase_timeout;
  s.phase = phase, s.phase_key = key, s.phase_timeout = timeout_s;
}

PhaseDeadline::~PhaseDeadline() {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.phase_mu);
  s.phase = prev_phase_, s.phase_key = prev_key_, s.phase_timeout = prev_timeout_;
}

void set_collective_timeout(double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds))
    throw std::invalid_argument("parallel.timeout_s: " + std::to_string(seconds) + ", expected a finite value > 0");
  st().timeout.store(seconds);
}

int next_comm_id() { return ++st().comm_counter; }

void watchdog_set_step(int64_t step) { st().step.store(step); }
int64_t watchdog_step() { return st().step.load(); }
bool watchdog_heartbeat_on() { return st().running && st().heartbeat; }

void watchdog_start(const WatchdogOptions& o) {
  State& s = st();
  set_collective_timeout(o.timeout_s);
  if (s.running) return;
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) throw std::runtime_error("parallel/watchdog: MPI is not initialised (call gmod::Runtime first)");
  MPI_Comm_rank(MPI_COMM_WORLD, &s.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &s.world);
  int level = 0;
  MPI_Query_thread(&level);
  set_abort_bound(o.abort_s);
  s.period = o.heartbeat_s > 0 ? o.heartbeat_s : std::min(1.0, o.timeout_s / 10);
  s.heartbeat = s.world > 1 && level >= MPI_THREAD_MULTIPLE;
  if (s.world == 1) {
    s.heartbeat_off = "heartbeat off: one rank";
  } else if (!s.heartbeat) {
    s.heartbeat_off = "heartbeat off: MPI provides thread level " + std::to_string(level) +
                      ", not MPI_THREAD_MULTIPLE; ranks missing cannot be named";
    if (s.rank == 0)
      std::fprintf(stderr, "gmod: warning: parallel/watchdog: %s (collective deadlines still apply)\n",
                   s.heartbeat_off.c_str());
  }
  if (s.heartbeat) {
    // Non-blocking forms polled under the deadline (the thread that would time a blocking call is not running yet).
    MPI_Request req;
    const CollectiveId dup{"watchdog start (MPI_Comm_idup)", 0, 1};
    int rc = MPI_Comm_idup(MPI_COMM_WORLD, &s.hb, &req);
    if (rc != MPI_SUCCESS) throw std::runtime_error("parallel/watchdog: MPI_Comm_idup failed: " + mpi_error(rc));
    watchdog_wait_mpi(1, &req, dup);
    MPI_Comm_set_errhandler(s.hb, MPI_ERRORS_RETURN);
    // Every rank's host and pid, so that messages say where a missing rank runs.
    char mine[64] = {0};
    char host[48] = {0};
    gethostname(host, sizeof host - 1);
    std::snprintf(mine, sizeof mine, "%s:%d", host, int(getpid()));
    std::vector<char> all(size_t(s.world) * sizeof mine);
    const CollectiveId gather{"watchdog start (MPI_Iallgather)", 0, 2};
    rc = MPI_Iallgather(mine, sizeof mine, MPI_CHAR, all.data(), sizeof mine, MPI_CHAR, s.hb, &req);
    if (rc != MPI_SUCCESS) throw std::runtime_error("parallel/watchdog: MPI_Iallgather failed: " + mpi_error(rc));
    watchdog_wait_mpi(1, &req, gather);
    s.where.clear();
    for (int r = 0; r < s.world; ++r) s.where.emplace_back(all.data() + size_t(r) * sizeof mine);
    const double t = now_s();
    s.peers.assign(size_t(s.world), Peer{});
    for (auto& p : s.peers) p.last_seen = t;
  }
  s.stop.store(false);
  s.thread = std::thread(loop);
  s.running = true;
}

void watchdog_stop() {
  State& s = st();
  if (!s.running) return;
  s.stop.store(true);
  if (s.thread.joinable()) s.thread.join();
  s.running = false;
  s.heartbeat_off = "watchdog stopped";
  // s.hb is left to MPI_Finalize: peers' last beats may still arrive on it.
}

void watchdog_wait_mpi(int n, MPI_Request* reqs, const CollectiveId& id) {
  if (n <= 0) return;
  int flag = 0;
  auto test = [&] {
    const int rc = MPI_Testall(n, reqs, &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      clear_wait();
      throw std::runtime_error("parallel/mpi_comm: " + describe(id) + " failed: " + mpi_error(rc));
    }
  };
  // The deadline starts before the first test: MPI may set up connections inside the first call.
  const double t0 = now_s(), timeout = collective_timeout();
  test();
  if (flag) return;
  set_wait(id, true, t0, timeout);
  // Spin briefly (small collectives finish in microseconds), then yield, then sleep between polls so that waiting
  // ranks leave the cores to the ones still computing.
  for (long it = 0;; ++it) {
    test();
    if (flag) break;
    const double waited = now_s() - t0;
    if (waited > timeout) watchdog_fail(describe(id) + " did not complete within " + deadline_text(), &id);
    if (it < 2000) continue;
    if (waited < 0.05)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  clear_wait();
}

WaitScope::WaitScope(const CollectiveId& id) { set_wait(id, false, now_s(), collective_timeout()); }
WaitScope::~WaitScope() { clear_wait(); }

void watchdog_register(WatchdogClient* c) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.clients_mu);
  s.clients.push_back(c);
}

void watchdog_unregister(WatchdogClient* c) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.clients_mu);
  s.clients.erase(std::remove(s.clients.begin(), s.clients.end(), c), s.clients.end());
}

std::string watchdog_peer_report(const CollectiveId* id) {
  State& s = st();
  if (!s.running || !s.heartbeat) return s.heartbeat_off;
  const double t = now_s(), silent_after = 3 * s.period + 0.5;
  std::vector<std::string> out;
  std::lock_guard<std::mutex> lock(s.mu);
  for (int r = 0; r < s.world; ++r) {
    if (r == s.rank) continue;
    const Peer& p = s.peers[size_t(r)];
    const std::string name = "rank " + std::to_string(r) + (size_t(r) < s.where.size() ? " [" + s.where[r] + "]" : "");
    if (p.bye) {
      if (id) out.push_back(name + " (left the job: finished or exiting)");
      continue;
    }
    const double age = t - p.last_seen;
    if (age > silent_after) {
      out.push_back(name + " (no heartbeat for " + fmt_s(age) + ": stopped, hung or dead)");
      continue;
    }
    if (!id) continue;
    const Beat& b = p.beat;
    if (b.waiting && b.comm == id->comm && b.seq == id->seq) continue;  // in this collective
    CollectiveId theirs{b.what, b.comm, b.seq};
    std::string where = !p.heard ? "no heartbeat received yet"
                        : b.waiting ? "waiting in " + describe(theirs)
                                    : "not in a collective (computing or in I/O); last " + describe(theirs);
    out.push_back(name + " (alive at step " + std::to_string(b.step) + ", " + where + ")");
  }
  if (id) {
    if (out.empty()) return "every rank is waiting in this collective (a network or MPI problem)";
    std::string m = "ranks missing from it: ";
    for (size_t i = 0; i < out.size(); ++i) m += (i ? "; " : "") + out[i];
    return m;
  }
  if (out.empty()) return "every rank sends heartbeats";
  std::string m = "silent ranks: ";
  for (size_t i = 0; i < out.size(); ++i) m += (i ? "; " : "") + out[i];
  return m;
}

void watchdog_fail(const std::string& cause, const CollectiveId* id) {
  State& s = st();
  if (s.failing.exchange(true)) {
    // Another thread is already reporting and aborting (and bounded: see below).
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  const double bound = s.abort_s.load();
  const int rank = my_rank();
  // Backstop: whatever blocks below (a lock held by a thread stuck in a driver, MPI_Abort itself), the process ends.
  std::thread([bound, rank] {
    std::this_thread::sleep_for(std::chrono::duration<double>(2 * bound + 1));
    std::fprintf(stderr, "[rank %d] watchdog: the job did not end within %.1f s of the failure; exiting\n", rank,
                 2 * bound + 1);
    std::_Exit(1);
  }).detach();
  const std::string peers = watchdog_peer_report(id);
  unblock_output_pipes();
  std::fprintf(stderr, "[rank %d] watchdog: %s at step %lld; %s. Aborting the job.\n", rank, cause.c_str(),
               static_cast<long long>(s.step.load()), peers.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  // The clients' abort (ncclCommAbort can block, e.g. on a hung peer or GPU) runs on a thread of its own; MPI_Abort
  // follows when it is done or after `bound` seconds, whichever is first.
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread([done] {
    std::vector<WatchdogClient*> clients;
    {
      std::lock_guard<std::mutex> lock(st().clients_mu);
      clients = st().clients;
    }
    for (WatchdogClient* c : clients) c->abort();
    done->store(true);
  }).detach();
  const double t0 = now_s();
  while (!done->load() && now_s() - t0 < bound) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (!done->load()) {
    std::fprintf(stderr, "[rank %d] watchdog: aborting the communicators did not finish within %.1f s; ending the "
                 "job without them\n", rank, bound);
    std::fflush(stderr);
  }
  int inited = 0, fin = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&fin);
  if (inited && !fin) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

}  // namespace gmod

// Watchdog: a deadline on every collective, NCCL error/timeout monitoring and a heartbeat between the ranks, so that a
// hung, stopped or dead rank ends the whole job within `parallel.timeout_s` with the cause named, instead of leaving a
// job that hangs until its time limit.
//   - Deadlines: MpiComm runs every collective as its non-blocking form and polls it (MPI_Testall) through
//     watchdog_wait_mpi(); NcclComm records an event after each collective and the watchdog thread polls the events
//     and ncclCommGetAsyncError() (WatchdogClient). Calls that cannot be polled (ncclCommInitRank) are marked with a
//     WaitScope and timed by the watchdog thread.
//   - Heartbeat (watchdog_start(), MPI_THREAD_MULTIPLE and more than one rank): a background thread sends a 64-byte
//     state (step, the collective it waits in) to every other rank once per period on a duplicate of
//     MPI_COMM_WORLD and receives theirs. A rank silent for timeout_s (SIGSTOPped, dead, its host hung) ends the
//     job, and a collective that times out names the ranks that are not in it, and where they are.
//   - On any failure: "[rank R] watchdog: <what> at step S; <ranks>" on stderr, every NcclComm is ncclCommAbort'ed
//     on a thread of its own, waited for at most WatchdogOptions::abort_s, then MPI_Abort ends every rank (mpirun
//     kills the rest); a backstop _exit()s the process if even that has not ended it 2 * abort_s + 1 s later.
//   - Phases (PhaseDeadline): a named stretch where ranks legitimately wait longer than parallel.timeout_s (ARank on
//     rank 0, the CRC check of a checkpoint) gets its own deadline, and a timeout in it names the phase and its key.
// Nothing here touches tensors: the heartbeat uses its own communicator, so results are bitwise unaffected.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>

namespace gmod {

struct WatchdogOptions {
  double timeout_s = 600.0;  // deadline of one collective, and the longest a peer may be silent
  double heartbeat_s = 0.0;  // heartbeat period; 0 = min(1 s, timeout_s / 10)
  // On a failure, the longest the clients' abort() (ncclCommAbort, which can block) may take before MPI_Abort is
  // called regardless.
  double abort_s = 10.0;
};

// One collective as the watchdog names it. `what` must be a string literal (kept by pointer); the heartbeat carries
// its first 31 characters.
struct CollectiveId {
  const char* what = "";  // e.g. "all_reduce (MPI_Iallreduce)"
  int comm = 0;           // communicator number: creation order, the same on every rank
  int64_t seq = 0;        // collectives started on that communicator so far, this one included
};
std::string describe(const CollectiveId& id);  // "all_reduce (MPI_Iallreduce), collective #12 of communicator 1"

// Deadline of every collective in seconds: 600 until watchdog_start() or set_collective_timeout() changes it.
double collective_timeout();
void set_collective_timeout(double seconds);
// The deadline in force for a collective started now, as messages name it: "parallel.timeout_s = 600.0 s", or in a
// phase "parallel.arank_timeout_s = 3600.0 s (the deadline of phase 'ARank ...')".
std::string deadline_text();
// Seconds the watchdog lets the clients' abort() take before MPI_Abort (WatchdogOptions::abort_s).
void set_abort_bound(double seconds);

// A named phase with its own deadline, entered by every rank (e.g. rank 0 runs ARank while the others wait in the
// broadcast of its result): while it lives, collective_timeout() is `timeout_s` and a timeout names the phase and
// its config key `key`. Nests (the inner one wins); `phase` and `key` must be string literals.
class PhaseDeadline {
 public:
  PhaseDeadline(const char* phase, const char* key, double timeout_s);
  ~PhaseDeadline();
  PhaseDeadline(const PhaseDeadline&) = delete;
  PhaseDeadline& operator=(const PhaseDeadline&) = delete;

 private:
  const char* prev_phase_;
  const char* prev_key_;
  double prev_timeout_;
};

// Numbers communicators in creation order (every rank creates them in the same order: creation is collective).
int next_comm_id();

// Collective over MPI_COMM_WORLD: sets the deadline and starts the watchdog thread (with the heartbeat when MPI
// provides MPI_THREAD_MULTIPLE and the world has more than one rank; otherwise a warning says it is off).
void watchdog_start(const WatchdogOptions& options);
// Tells the peers this rank is leaving (so finishing first is not reported as a silent rank) and joins the thread.
// Runtime's destructor calls it before MPI_Finalize; harmless when not started.
void watchdog_stop();
bool watchdog_heartbeat_on();

// The training step named in watchdog messages (the trainer sets it at the start of every step).
void watchdog_set_step(int64_t step);
int64_t watchdog_step();

// Completes n MPI requests, polling MPI_Testall; past the deadline: watchdog_fail naming `id`. An MPI error
// (communicators use MPI_ERRORS_RETURN) throws std::runtime_error naming `id`.
void watchdog_wait_mpi(int n, MPI_Request* reqs, const CollectiveId& id);

// Marks the calling thread as blocked in a call that cannot be polled; the watchdog thread fails the job when it
// lasts longer than the deadline.
class WaitScope {
 public:
  explicit WaitScope(const CollectiveId& id);
  ~WaitScope();
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;
};

// Something the watchdog thread polls (NcclComm). poll(): "" when healthy, else what failed (an asynchronous error,
// a collective past the deadline). abort(): release what peers may be blocked on (ncclCommAbort), called once on
// every client before the job is aborted, on a thread of its own and waited for at most abort_s (an abort that
// blocks does not keep the job from ending). poll() is called from the watchdog thread.
class WatchdogClient {
 public:
  virtual ~WatchdogClient() = default;
  virtual std::string poll(double timeout_s) = 0;
  virtual void abort() = 0;
};
void watchdog_register(WatchdogClient* client);
void watchdog_unregister(WatchdogClient* client);

// The ranks' whereabouts from their heartbeats: with `id`, which ranks are not waiting in that collective; without,
// the ranks that fell silent. "heartbeat off" when it does not run.
std::string watchdog_peer_report(const CollectiveId* id);
// Makes stdout/stderr non-blocking when they are pipes (a launcher that stopped reading them, e.g. mpirun tearing
// the job down, must not keep a rank from reaching MPI_Abort). Called on the way to an abort.
void unblock_output_pipes();
// Prints "[rank R] watchdog: <cause> at step S; <peer report>", aborts every client and the job (MPI_Abort).
[[noreturn]] void watchdog_fail(const std::string& cause, const CollectiveId* id = nullptr);

}  // namespace gmod

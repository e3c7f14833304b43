// Helper executable for test_watchdog_bounds.cpp (not a GoogleTest binary): the watchdog's bounds under mpirun.
//   helper_watchdog abort_hangs T : deadline T s, abort bound 3 s; every rank registers a WatchdogClient whose abort()
//                     blocks for ever in a real MPI call (MPI_Recv of a message nobody sends, as ncclCommAbort can
//                     block on a hung peer); the last rank never joins the all-reduce of step 5. The job must still end
//                     within T + the bound + a few seconds.
//   helper_watchdog gather_missing T : the last rank never joins all_gather_strings (the exchange gmod train's banner
//                     uses); the others must end the job within T, naming the exchange.
//   helper_watchdog phase T P D : every rank enters a PhaseDeadline of P s; rank 0 works D s before it joins a
//                     broadcast the others already wait in. D > T but < P: exits 0 ("phase done"); D > P: the timeout
//                     names the phase and its key.
#include "parallel/host_gather.h"
#include "parallel/mpi_comm.h"
#include "parallel/runtime.h"
#include "parallel/watchdog.h"

#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>

namespace {

// A client whose abort blocks for ever inside MPI (registered by abort_hangs).
class BlockingAbortClient final : public gmod::WatchdogClient {
 public:
  BlockingAbortClient() { MPI_Comm_dup(MPI_COMM_WORLD, &comm_); }
  std::string poll(double) override { return ""; }
  void abort() override {
    std::fprintf(stderr, "helper: abort() of the blocking client entered\n");
    std::fflush(stderr);
    int x = 0;
    MPI_Recv(&x, 1, MPI_INT, MPI_ANY_SOURCE, 77, comm_, MPI_STATUS_IGNORE);  // nobody sends: blocks for ever
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

void misbehave(int rank, const char* what) {
  std::fprintf(stderr, "helper: rank %d (pid %d) misbehaves: %s\n", rank, int(getpid()), what);
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::minutes(10));
}

}  // namespace

int main(int argc, char** argv) {
  gmod::Runtime rt(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  const double timeout = argc > 2 ? std::stod(argv[2]) : 2.0;
  return gmod::run_guarded([&] {
    gmod::watchdog_start(gmod::WatchdogOptions{timeout, 0.0, 3.0});
    gmod::MpiComm comm;
    const int rank = comm.rank(), last = comm.world_size() - 1;
    if (mode == "abort_hangs") {
      static BlockingAbortClient client;
      gmod::watchdog_register(&client);
      for (int step = 1; step <= 10; ++step) {
        gmod::watchdog_set_step(step);
        if (step == 5 && rank == last) misbehave(rank, "never joins the all-reduce");
        if (comm.all_reduce(1.0, gmod::ReduceOp::Sum) != comm.world_size()) throw std::runtime_error("bad sum");
      }
      return 0;
    }
    if (mode == "gather_missing") {
      if (rank == last) misbehave(rank, "never joins the gather");
      const auto all = gmod::all_gather_strings("rank " + std::to_string(rank), "test gather (MPI_Iallgatherv)");
      std::printf("gathered %zu\n", all.size());
      return 0;
    }
    if (mode == "phase") {
      const double phase_s = std::stod(argv[3]), work_s = std::stod(argv[4]);
      {
        const gmod::PhaseDeadline phase("test phase (rank 0 works, the others wait)", "parallel.test_phase_timeout_s",
                                        phase_s);
        if (rank == 0) std::this_thread::sleep_for(std::chrono::duration<double>(work_s));
        double v = rank == 0 ? 42.0 : 0.0;
        at::Tensor t = at::full({1}, v, at::kDouble);
        comm.broadcast(t, 0);
        if (t.item<double>() != 42.0) throw std::runtime_error("bad broadcast");
      }
      // After the phase the ordinary deadline is back.
      if (gmod::collective_timeout() != timeout) throw std::runtime_error("phase deadline not restored");
      if (comm.all_reduce(1.0, gmod::ReduceOp::Sum) != comm.world_size()) throw std::runtime_error("bad sum");
      if (rank == 0) std::printf("phase done world %d\n", comm.world_size());
      return 0;
    }
    throw std::runtime_error("helper_watchdog: unknown mode '" + mode + "'");
  });
}

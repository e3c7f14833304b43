// Helper executable for test_abort.cpp and test_watchdog.cpp (not a GoogleTest binary).
//   helper_abort ok     : all-reduces the ranks' 1s and prints "ok world <N> sum <N>" on rank 0 (also runs without
//                         mpirun, as an MPI singleton).
//   helper_abort throw  : the last rank throws while the others wait in a barrier; run_guarded must print
//                         "[rank R] error: ..." and abort the job with a non-zero exit code instead of hanging.
//   helper_abort watch_<what> T : watchdog_start(timeout T s), then 10 "steps" of an all-reduce each; at step 5 the
//                         last rank misbehaves:
//     watch_ok    nobody; afterwards rank 0 keeps its watchdog running 2T longer than the others, who have left
//                 (their goodbye must keep rank 0 from reporting them silent); exits 0.
//     watch_hang  sleeps 10 min (alive, heartbeat running) instead of joining the all-reduce;
//     watch_stop  SIGSTOPs itself (every thread stops: no heartbeat);
//     watch_kill  SIGKILLs itself.
#include "parallel/mpi_comm.h"
#include "parallel/runtime.h"
#include "parallel/watchdog.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  gmod::Runtime rt(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "ok";
  return gmod::run_guarded([&] {
    if (mode.rfind("watch_", 0) == 0) {
      const double timeout = argc > 2 ? std::stod(argv[2]) : 2.0;
      gmod::watchdog_start(gmod::WatchdogOptions{timeout});
      gmod::MpiComm comm;
      const bool bad = comm.rank() == comm.world_size() - 1;
      for (int step = 1; step <= 10; ++step) {
        gmod::watchdog_set_step(step);
        if (step == 5 && bad) {
          std::fprintf(stderr, "helper: rank %d (pid %d) misbehaves: %s\n", comm.rank(), int(getpid()), mode.c_str());
          std::fflush(stderr);
          if (mode == "watch_hang") std::this_thread::sleep_for(std::chrono::minutes(10));
          if (mode == "watch_stop") raise(SIGSTOP);
          if (mode == "watch_kill") raise(SIGKILL);
        }
        const double sum = comm.all_reduce(1.0, gmod::ReduceOp::Sum);
        if (sum != comm.world_size()) throw std::runtime_error("bad sum");
      }
      if (comm.rank() == 0) {
        std::this_thread::sleep_for(std::chrono::duration<double>(2 * timeout));
        std::printf("watch done world %d heartbeat %s\n", comm.world_size(),
                    gmod::watchdog_heartbeat_on() ? "on" : "off");
      }
      return 0;
    }
    gmod::MpiComm comm;
    if (mode == "throw" && comm.rank() == comm.world_size() - 1)
      throw std::runtime_error("deliberate failure in helper_abort");
    comm.barrier();
    const double sum = comm.all_reduce(1.0, gmod::ReduceOp::Sum);
    if (comm.rank() == 0) std::printf("ok world %d sum %g\n", comm.world_size(), sum);
    return sum == comm.world_size() ? 0 : 3;
  });
}

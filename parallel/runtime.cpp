#include "parallel/runtime.h"

#include "parallel/mpi_comm.h"
#include "parallel/watchdog.h"
#ifdef GMOD_WITH_CUDA
#include "parallel/nccl_comm.h"
#endif

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace gmod {
namespace {

int g_thread_level = 0;
int g_local_rank = -1;
double g_finalize_timeout = 0;

bool mpi_active() {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  return inited && !finalized;
}

}  // namespace

Runtime::Runtime(int* argc, char*** argv) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) return;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &g_thread_level) != MPI_SUCCESS)
    throw std::runtime_error("parallel/runtime: MPI_Init_thread failed");
  owns_ = true;
  install_terminate_handler();
}

Runtime::~Runtime() {
  watchdog_stop();  // tell the peers we leave before MPI goes away
  if (!owns_ || !mpi_active()) return;
  const double limit = finalize_timeout();
  if (limit <= 0) {
    MPI_Finalize();
    return;
  }
  const int rank = world_rank();
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread guard([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (cv.wait_for(lock, std::chrono::duration<double>(limit), [&] { return done; })) return;
    std::fprintf(stderr,
                 "[rank %d] warning: MPI_Finalize did not return within %.0f s (the launcher is tearing the job down?);"
                 " exiting without it\n",
                 rank, limit);
    std::fflush(stderr);
    std::fflush(stdout);
    std::_Exit(0);
  });
  MPI_Finalize();
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
  guard.join();
}

void set_finalize_timeout(double seconds) { g_finalize_timeout = seconds; }
double finalize_timeout() { return g_finalize_timeout; }

bool runtime_initialized() { return mpi_active(); }

int world_rank() {
  int r = 0;
  if (mpi_active()) MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int n = 1;
  if (mpi_active()) MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

int local_rank() {
  if (!mpi_active()) return 0;
  if (g_local_rank < 0)  // timed by the watchdog thread
    g_local_rank = node_local_rank(MPI_COMM_WORLD, world_rank(), CollectiveId{"MPI_Comm_split_type (local)", 0, 0});
  return g_local_rank;
}

int mpi_thread_level() { return g_thread_level; }

std::shared_ptr<Comm> make_comm(const at::Device& device) {
  if (!mpi_active()) throw std::runtime_error("parallel/runtime: make_comm before gmod::Runtime initialised MPI");
  if (device.is_cpu()) return std::make_shared<MpiComm>();
  if (device.is_cuda()) {
#ifdef GMOD_WITH_CUDA
    return std::make_shared<NcclComm>(MPI_COMM_WORLD, device.has_index() ? device.index() : -1);
#else
    throw std::runtime_error("parallel/runtime: CUDA device requested but gmod was built without CUDA/NCCL");
#endif
  }
  throw std::runtime_error("parallel/runtime: no communicator for device " + device.str());
}

void abort_job(const std::string& msg, int code) {
  unblock_output_pipes();  // never block on a pipe the launcher stopped reading, on the way to MPI_Abort
  std::fprintf(stderr, "[rank %d] error: %s\n", world_rank(), msg.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  if (mpi_active()) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

int run_guarded(const std::function<int()>& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    abort_job(e.what());
  } catch (...) {
    abort_job("unknown exception");
  }
}

void install_terminate_handler() {
  std::set_terminate([] {
    std::string what = "std::terminate called";
    if (auto ep = std::current_exception()) {
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = std::string("uncaught exception: ") + e.what();
      } catch (...) {
        what = "uncaught non-std exception";
      }
    }
    abort_job(what);
  });
}

}  // namespace gmod

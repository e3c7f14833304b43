// Process-wide distributed runtime: MPI init/finalize (works without mpirun as a single-process "singleton"),
// world/local rank, the Comm factory (MPI for CPU tensors, NCCL for CUDA tensors) and rank-tagged fatal-error
// handling so one failing rank ends the whole job promptly instead of leaving the others hanging in a collective.
#pragma once

#include "parallel/comm.h"

#include <functional>
#include <memory>
#include <string>

namespace gmod {

// RAII: initialises MPI (MPI_Init_thread, MPI_THREAD_MULTIPLE requested) unless someone already did, and finalises
// it on destruction if it initialised it (after watchdog_stop()). Construct once in main(); nesting is harmless.
// With set_finalize_timeout(s > 0), MPI_Finalize is bounded: when it has not returned after s seconds (mpirun tearing
// the job down after a SIGTERM no longer answers), the process prints a warning and exits with code 0 — everything
// before it (the checkpoint) is done. Unbounded by default: ranks legitimately wait there for slower ones, and a
// process that exits without MPI_Finalize makes a healthy mpirun abort the job.
class Runtime {
 public:
  Runtime(int* argc, char*** argv);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

 private:
  bool owns_ = false;
};

// Seconds MPI_Finalize may take (<= 0: unbounded, the default). gmod train sets 10 s after a stop by signal.
void set_finalize_timeout(double seconds);
double finalize_timeout();

bool runtime_initialized();
int world_rank();   // MPI_COMM_WORLD rank (0 before init)
int world_size();   // MPI_COMM_WORLD size (1 before init)
int local_rank();   // rank among the processes of this node (MPI_COMM_TYPE_SHARED)
int mpi_thread_level();  // what MPI_Init_thread provided

// MpiComm for CPU, NcclComm for CUDA (which also selects this rank's GPU = local_rank % device_count; pass a
// device without index to get that choice). Throws when CUDA is requested and the build has no CUDA.
std::shared_ptr<Comm> make_comm(const at::Device& device);

// Runs fn; an exception on any rank prints "[rank R] error: <what>" to stderr and MPI_Aborts the job (exit code 1),
// so ranks blocked in collectives do not hang. Returns fn's value otherwise.
int run_guarded(const std::function<int()>& fn);
// Prints "[rank R] error: <msg>" and aborts every rank of the job.
[[noreturn]] void abort_job(const std::string& msg, int code = 1);
// std::terminate (an exception escaping a worker thread, ...) also goes through abort_job.
void install_terminate_handler();

}  // namespace gmod

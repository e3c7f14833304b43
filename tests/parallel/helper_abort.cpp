// Helper executable for test_abort.cpp (not a GoogleTest binary).
//   helper_abort ok     : all-reduces the ranks' 1s and prints "ok world <N> sum <N>" on rank 0 (also runs without
//                         mpirun, as an MPI singleton).
//   helper_abort throw  : the last rank throws while the others wait in a barrier; run_guarded must print
//                         "[rank R] error: ..." and abort the job with a non-zero exit code instead of hanging.
#include "parallel/mpi_comm.h"
#include "parallel/runtime.h"

#include <cstdio>
#include <stdexcept>
#include <string>

int main(int argc, char** argv) {
  gmod::Runtime rt(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "ok";
  return gmod::run_guarded([&] {
    gmod::MpiComm comm;
    if (mode == "throw" && comm.rank() == comm.world_size() - 1)
      throw std::runtime_error("deliberate failure in helper_abort");
    comm.barrier();
    const double sum = comm.all_reduce(1.0, gmod::ReduceOp::Sum);
    if (comm.rank() == 0) std::printf("ok world %d sum %g\n", comm.world_size(), sum);
    return sum == comm.world_size() ? 0 : 3;
  });
}

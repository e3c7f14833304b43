// Small host-side exchanges between the ranks of MPI_COMM_WORLD for set-up code (gmod train's banner of every
// rank's device, the count of ranks per node), as non-blocking MPI polled under the watchdog's deadline
// (watchdog_wait_mpi): a rank that never joins ends the job within parallel.timeout_s, named, instead of leaving
// the others blocked in MPI_Gather forever.
#pragma once

#include <string>
#include <vector>

namespace gmod {

// Every rank's `mine`, indexed by rank (MPI_Iallgather of the lengths, then MPI_Iallgatherv). Collective over
// MPI_COMM_WORLD; `what` (a string literal) names it in a timeout. One string when MPI is not initialised.
std::vector<std::string> all_gather_strings(const std::string& mine, const char* what);

// Ranks of MPI_COMM_WORLD on this rank's host (by MPI_Get_processor_name), through all_gather_strings.
int ranks_on_this_host();

}  // namespace gmod

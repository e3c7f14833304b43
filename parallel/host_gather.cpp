#include "parallel/host_gather.h"

#include "parallel/watchdog.h"

#include <mpi.h>

#include <stdexcept>

namespace gmod {

std::vector<std::string> all_gather_strings(const std::string& mine, const char* what) {
  int inited = 0, fin = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&fin);
  if (!inited || fin) return {mine};
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  static int64_t seq = 0;  // exchanges so far (every rank runs the same ones)
  const CollectiveId id{what, 0, ++seq};
  auto check = [&](int rc) {
    if (rc != MPI_SUCCESS) throw std::runtime_error("parallel/host_gather: " + describe(id) + " failed");
  };
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(static_cast<size_t>(world)), offs(static_cast<size_t>(world));
  MPI_Request req;
  check(MPI_Iallgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD, &req));
  watchdog_wait_mpi(1, &req, id);
  int total = 0;
  for (int r = 0; r < world; ++r) offs[size_t(r)] = total, total += lens[size_t(r)];
  std::string all(static_cast<size_t>(total), '\0');
  check(MPI_Iallgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, MPI_COMM_WORLD,
                        &req));
  watchdog_wait_mpi(1, &req, id);
  std::vector<std::string> out;
  for (int r = 0; r < world; ++r) out.push_back(all.substr(size_t(offs[size_t(r)]), size_t(lens[size_t(r)])));
  return out;
}

int ranks_on_this_host() {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) return 1;
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int n = 0;
  MPI_Get_processor_name(name, &n);
  const std::string me(name, size_t(n));
  int count = 0;
  for (const std::string& h : all_gather_strings(me, "ranks per host (MPI_Iallgather)"))
    count += h == me ? 1 : 0;
  return count;
}

}  // namespace gmod

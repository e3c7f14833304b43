// `gmod train --config X.json [--set key.path=value ...]`: training under mpirun (one process per rank) or as a
// single process. Rank 0 prints the job (world size, devices, MPI and NCCL versions) and the effective config; an
// error on any rank is printed as "[rank R] error: ..." and ends the whole job (run_guarded).
#include <ATen/Parallel.h>
#include <mpi.h>
#include <torch/version.h>

#include <cstring>
#include <iostream>

#include "launch/args.h"
#include "parallel/runtime.h"
#include "trainer/trainer.h"
#ifdef GMOD_WITH_CUDA
#include <nccl.h>
#endif

namespace gmod::cli {
namespace {

std::string mpi_version() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(buf, &len);
  std::string s(buf, strnlen(buf, size_t(len)));  // len may count the terminating NUL
  if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s;
}

std::string nccl_version() {
#ifdef GMOD_WITH_CUDA
  int v = 0;
  if (ncclGetVersion(&v) == ncclSuccess)
    return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
  return "unknown";
#else
  return "not compiled in";
#endif
}

int run_train(const std::vector<std::string>& argv) {
  Args a(argv, {"dry-run"});
  a.check_known({"config", "set", "threads", "dry-run"});
  if (!a.positional().empty()) throw std::invalid_argument("unexpected argument " + a.positional()[0]);
  Runtime runtime(nullptr, nullptr);
  return run_guarded([&] {
    if (auto t = a.get("threads")) at::set_num_threads(std::stoi(*t));
    TrainConfig cfg = read_train_config(a.get_or("config", ""), a.all("set"));
    const int rank = world_rank(), world = world_size();
    validate_train_config(cfg, world);
    if (rank == 0) std::cout << "effective config:\n" << to_json(cfg).dump(2) << "\n";
    if (a.flag("dry-run")) return 0;

    auto comm = make_comm(at::Device(cfg.model.device));
    // Every rank's device, gathered for rank 0's banner.
    std::string dev = comm->device().str();
    char mine[32] = {0};
    std::strncpy(mine, dev.c_str(), sizeof mine - 1);
    std::vector<char> all(size_t(world) * sizeof mine);
    MPI_Gather(mine, sizeof mine, MPI_CHAR, all.data(), sizeof mine, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      std::cout << "gmod train: " << world << " rank(s), backend " << comm->backend() << ", devices [";
      for (int r = 0; r < world; ++r) std::cout << (r ? ", " : "") << (all.data() + r * sizeof mine);
      std::cout << "], " << at::get_num_threads() << " CPU threads/rank\nLibTorch " << TORCH_VERSION << "; MPI "
                << mpi_version() << "; NCCL " << nccl_version() << std::endl;
    }
    Trainer trainer(cfg, comm);
    trainer.run();
    return 0;
  });
}

Register reg({"train", "train a (MoD) LLaVA model: --config X.json [--set key.path=value ...]", run_train});

}  // namespace
}  // namespace gmod::cli

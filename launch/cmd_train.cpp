// `gmod train --config X.json [--set key.path=value ...]`: training under mpirun (one process per rank) or as a
// single process. Rank 0 prints the job (world size, devices, every rank's host and local rank, MPI and NCCL
// versions) and the effective config; an error on any rank is printed as "[rank R] error: ..." and ends the whole
// job (run_guarded).
#include <ATen/Parallel.h>
#include <mpi.h>
#include <torch/version.h>

#include <cstring>
#include <iostream>

#include "launch/args.h"
#include "parallel/host_gather.h"
#include "parallel/runtime.h"
#include "parallel/watchdog.h"
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

std::string processor_name() {
  char buf[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  MPI_Get_processor_name(buf, &len);
  return std::string(buf, strnlen(buf, size_t(len)));
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

struct TrainOptions {
  std::string config;
  std::vector<std::string> sets;
  int threads = 0;
  bool dry_run = false;
  std::string profile_steps;
};

int run_train(const TrainOptions& o) {
  // First of all: SIGTERM/SIGINT/SIGUSR1 during set-up (model loading, ARank, resume checks) must not kill a rank
  // silently; they are recorded, and the trainer stops cleanly once set-up is done (trainer/trainer.h).
  install_stop_signal_handlers();
  Runtime runtime(nullptr, nullptr);
  return run_guarded([&] {
    if (o.threads > 0) at::set_num_threads(o.threads);
    const int rank = world_rank(), world = world_size();
    // Every problem of the file (reading and validation) in one message naming it.
    // Ranks of this job on this host (for the model.device check), polled under the default deadline.
    std::vector<std::string> sets = o.sets;
    if (!o.profile_steps.empty()) sets.push_back("metrics.profile_steps=" + o.profile_steps);
    // read -> validate -> resolve, once (trainer/run_plan.h); the Trainer takes the plan as it is.
    RunPlan plan = read_run_plan(o.config, sets, world, ranks_on_this_host());
    const TrainConfig& cfg = plan.config;
    if (rank == 0) std::cout << "effective config:\n" << to_json(cfg).dump(2) << "\n";
    if (o.dry_run) return 0;
    // Deadlines on every collective and the heartbeat between ranks, for the whole job (setup included).
    watchdog_start(WatchdogOptions{cfg.parallel.timeout_s});

    auto comm = make_comm(at::Device(cfg.model.device));
    // Every rank's device, gathered for rank 0's banner (non-blocking and polled: a rank that never joins ends
    // the job within parallel.timeout_s, named).
    const std::vector<std::string> all =
        all_gather_strings(comm->device().str(), "device banner (MPI_Iallgatherv)");
    // Where every rank runs: its host and its local rank (which picks its GPU), so that a multi-node launch shows
    // the placement mpirun made (tests/multinode).
    const std::vector<std::string> placed = all_gather_strings(
        processor_name() + "/" + std::to_string(local_rank()), "placement banner (MPI_Iallgatherv)");
    if (rank == 0) {
      std::cout << "gmod train: " << world << " rank(s), backend " << comm->backend() << ", devices [";
      for (int r = 0; r < world; ++r) std::cout << (r ? ", " : "") << all[size_t(r)];
      std::cout << "], " << at::get_num_threads() << " CPU threads/rank\nLibTorch " << TORCH_VERSION << "; MPI "
                << mpi_version() << "; NCCL " << nccl_version() << "\nranks (rank host/local rank): ";
      for (int r = 0; r < world; ++r) std::cout << (r ? ", " : "") << r << " " << placed[size_t(r)];
      std::cout << std::endl;
    }
    Trainer trainer(std::move(plan), comm);
    const TrainResult result = trainer.run();
    // Stopped by a signal: the checkpoint is written. After SIGTERM mpirun tears its runtime down, and MPI_Finalize
    // would wait for it until the launcher's SIGKILL; leave after 10 s instead.
    if (result.stopped_by_signal) set_finalize_timeout(10);
    return 0;
  });
}

Runner setup_train(CLI::App& app) {
  auto o = std::make_shared<TrainOptions>();
  app.footer("Under mpirun, one process per rank (launch/run_single_node.sh, run_multi_node.sh). docs/training.md "
             "lists the config keys.");
  add(app, "--config", o->config, "training config (configs/*.json); without it, the built-in defaults")
      ->type_name("JSON");
  add(app, "--set", o->sets, "override one config key, e.g. --set optimizer.lr=1e-4; repeat for several")
      ->type_name("KEY=VALUE");
  add(app, "--threads", o->threads, "CPU threads per rank (0: LibTorch's default)")->check(thread_count());
  add(app, "--profile-steps", o->profile_steps,
      "write a Chrome/Perfetto trace of steps A..B per rank to RUN_DIR/profile/ (= --set metrics.profile_steps=A-B)")
      ->type_name("A-B");
  add_flag(app, "--dry-run", o->dry_run, "validate the config, print the effective config and exit");
  return [o] { return run_train(*o); };
}

Register reg_train({"train", "train a (MoD) LLaVA model: --config X.json [--set key.path=value ...]",
                    setup_train});

}  // namespace
}  // namespace gmod::cli

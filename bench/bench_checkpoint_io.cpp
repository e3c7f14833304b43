// Checkpoint save and load speed of gmod's format, as the trainer runs them, on this job's ranks (mpirun -np N):
// the weights (--params fp32 values in 24 tensors) split over the ranks by bytes, each rank's ZeRO-1 optimizer shard
// (master, exp_avg, exp_avg_sq: 3 x params / N fp32), written by CheckpointWriter::save (every rank its files, rank 0
// commits), asynchronously (host copy = the stall, then the background write while "training" goes on), and read
// back as a resume reads it (CRC checks spread over the ranks, each weight part read by one rank and broadcast, each
// rank its own optimizer file). The "training step" beside the background write is a fixed CPU matmul loop on this
// rank's threads (--step-ms long when alone): its time with and without the write in flight is the slowdown an
// async save costs a CPU job (a GPU job's step competes only for memory bandwidth and the PCIe link).
// Prints one JSON line (rank 0): seconds and bytes per measurement; bench/bench_checkpoint.py makes the table.
//   bench_checkpoint_io --params 16000000 [--dir DIR] [--reps 2] [--step-ms 100] [--threads 1]
#include <ATen/ATen.h>
#include <torch/torch.h>

#include <ftw.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_help.h"
#include "parallel/mpi_comm.h"
#include "parallel/runtime.h"
#include "trainer/checkpoint/async_save.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/crc32.h"

using namespace gmod;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const char* kUsage =
    "bench_checkpoint_io: gmod checkpoint save (sync, async) and load speed on this job's ranks.\n"
    "usage: mpirun -np N bench_checkpoint_io --params P [--dir DIR] [--reps 2] [--step-ms 100] [--threads 1]\n"
    "  --params   model parameters (fp32); the state is 16 bytes per parameter in all (weights + 3 optimizer)\n"
    "  --dir      where the run directory goes (default: ./bench_checkpoint_io.tmp); removed at the end\n"
    "  --reps     repetitions of each measurement (the fastest is printed)\n"
    "  --step-ms  length of the stand-in training step when no save runs\n";

// Not std::filesystem::remove_all: it crashes in binaries linked to the torch wheel (docs/engineering.md).
void remove_tree(const std::string& p) {
  nftw(p.c_str(), [](const char* f, const struct stat*, int, struct FTW*) { return ::remove(f); }, 16,
       FTW_DEPTH | FTW_PHYS);
}

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct State {
  NamedTensors model_all;  // every weight (each rank holds them all, as data parallelism does)
  std::vector<std::string> names;
  std::vector<int> owner;  // split_model_by_bytes
  NamedTensors shard;      // master, exp_avg, exp_avg_sq
};

State make_state(int64_t params, int rank, int world) {
  State s;
  const int kTensors = 24;
  at::manual_seed(1234);
  for (int i = 0; i < kTensors; ++i) {
    const int64_t n = params / kTensors + (i < params % kTensors ? 1 : 0);
    s.model_all.emplace_back("layers." + std::to_string(i) + ".weight", at::randn({n}));
    s.names.push_back(s.model_all.back().first);
  }
  std::vector<int64_t> bytes;
  for (const auto& [n, t] : s.model_all) bytes.push_back(t.numel() * 4);
  s.owner = split_model_by_bytes(bytes, world);
  const int64_t per = (params + world - 1) / world;
  const int64_t b = std::min(params, per * rank), e = std::min(params, per * (rank + 1));
  at::manual_seed(99 + rank);
  for (const char* n : {"master", "exp_avg", "exp_avg_sq"}) s.shard.emplace_back(n, at::randn({e - b}));
  return s;
}

CheckpointContent content_of(const State& s, int64_t step, int rank) {
  CheckpointContent c;
  c.step = step;
  c.config = json{{"bench", "checkpoint_io"}};
  c.trainer_state = json::object();
  c.data_position = json::object();
  c.shard_layout = json::object();
  c.model_names = s.names;
  for (size_t i = 0; i < s.model_all.size(); ++i)
    if (s.owner[i] == rank) c.model.emplace_back(s.model_all[i].first, s.model_all[i].second);
  return c;
}

RankState rank_state_of(const State& s) {
  RankState r;
  for (const auto& [n, t] : s.shard) r.tensors.emplace_back(n, t);
  r.meta = json{{"bench", true}};
  return r;
}

// What an asynchronous save of the trainer copies (trainer/trainer_save.cpp): this rank's share of the weights and
// its optimizer shard, into the snapshot arena that every later save reuses.
void snapshot_into(SnapshotArena& arena, CheckpointContent& c, RankState& r) {
  std::vector<int64_t> sizes;
  for (const auto* ts : {&c.model, &r.tensors})
    for (const auto& [n, t] : *ts) sizes.push_back(t.numel() * int64_t(t.element_size()));
  arena.begin(sizes, /*pinned=*/false);
  for (auto* ts : {&c.model, &r.tensors})
    for (auto& [n, t] : *ts) t = arena.take(t);
}

// The stand-in step: matmuls of a fixed count, calibrated once to about step_ms.
struct Step {
  at::Tensor a = at::randn({256, 256}), b = at::randn({256, 256});
  int iters = 1;
  void run() const {
    at::Tensor x = a;
    for (int i = 0; i < iters; ++i) x = at::mm(x, b).tanh_();
  }
  void calibrate(double step_ms) {
    iters = 8;
    const auto t0 = Clock::now();
    run();
    const double per = since(t0) / iters;
    iters = std::max(1, int(step_ms / 1000.0 / per));
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (bench_help(argc, argv, kUsage)) return 0;
  Runtime rt(&argc, &argv);
  return run_guarded([&] {
    int64_t params = 16000000;
    std::string dir = "bench_checkpoint_io.tmp";
    int reps = 2, threads = 1;
    double step_ms = 100;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument("bench_checkpoint_io: " + a + " needs a value");
        return argv[++i];
      };
      if (a == "--params") params = int64_t(std::stod(next()));
      else if (a == "--dir") dir = next();
      else if (a == "--reps") reps = std::stoi(next());
      else if (a == "--step-ms") step_ms = std::stod(next());
      else if (a == "--threads") threads = std::stoi(next());
      else throw std::invalid_argument("bench_checkpoint_io: unknown option " + a + " (see --help)");
    }
    at::set_num_threads(threads);
    MpiComm mpi;
    Comm& comm = mpi;  // the scalar all_reduce lives on the interface
    const int rank = comm.rank(), world = comm.world_size();
    const std::string run = (fs::path(dir) / ("run-np" + std::to_string(world))).string();
    if (rank == 0) remove_tree(run);
    comm.barrier();
    const State s = make_state(params, rank, world);
    CheckpointOptions o;
    o.keep_last = 0;
    o.barrier = [&] { comm.barrier(); };
    auto max_over_ranks = [&](double v) { return comm.all_reduce(v, ReduceOp::Max); };
    int64_t step = 0;
    // Bytes of the whole checkpoint (every rank's files).
    double bytes = 0;

    // Synchronous saves.
    double sync_s = 1e30;
    std::string last;
    for (int r = 0; r < reps; ++r) {
      if (!last.empty() && rank == 0) remove_tree(last);
      comm.barrier();
      const auto t0 = Clock::now();
      last = CheckpointWriter(run, rank, world, o).save(content_of(s, ++step, rank), rank_state_of(s));
      sync_s = std::min(sync_s, max_over_ranks(since(t0)));
    }
    if (rank == 0)
      for (const auto& e : fs::directory_iterator(last)) bytes += double(fs::file_size(e.path()));

    // Loads as a resume does them (of the last synchronous save, page cache warm).
    double load_s = 1e30, verify_s = 0;
    for (int r = 0; r < reps; ++r) {
      NamedTensors into;
      for (const auto& [n, t] : s.model_all) into.emplace_back(n, at::empty_like(t));
      comm.barrier();
      const auto t0 = Clock::now();
      const auto files = CheckpointManager::manifest_files(last);
      for (size_t k = size_t(rank); k < files.size(); k += size_t(world)) {
        const std::string why = CheckpointManager::verify_file_deferring_data(last, files[k]);
        if (!why.empty()) throw std::runtime_error("bench_checkpoint_io: " + why);
      }
      comm.barrier();
      const double verified = max_over_ranks(since(t0));
      CheckpointReader reader(last);
      std::vector<std::string> crc_failures;  // as the trainer's resume: the large tensors' CRCs checked as read
      reader.collect_crc_failures(&crc_failures);
      CheckpointReader::ModelShare share;
      share.rank = rank;
      share.world_size = world;
      if (world > 1) share.broadcast = [&](at::Tensor& t, int root) { comm.broadcast(t, root); };
      reader.load_model_into(into, /*strict=*/true, share);
      const RankState mine = reader.read_rank_state(rank);
      if (!crc_failures.empty()) throw std::runtime_error("bench_checkpoint_io: " + crc_failures.front());
      const double total = max_over_ranks(since(t0));
      if (total < load_s) load_s = total, verify_s = verified;
      if (!mine.tensors.at(0).second.equal(s.shard.at(0).second) || !into.back().second.equal(s.model_all.back().second))
        throw std::runtime_error("bench_checkpoint_io: what was loaded differs from what was saved");
    }

    // Asynchronous saves: the host copy stalls training; the write runs beside stand-in steps.
    Step st;
    st.calibrate(step_ms);
    comm.barrier();
    double alone_ms = 1e30;
    for (int k = 0; k < 3; ++k) {
      const auto t0 = Clock::now();
      st.run();
      alone_ms = std::min(alone_ms, since(t0) * 1e3);
    }
    SnapshotArena arena;  // as the trainer's: allocated by the first async save, reused by the later ones
    struct Async {
      double stall_s = 1e30, async_s = 1e30, write_s = 0, inflight_ms = 0;
      int inflight_steps = 0;
    };
    // background_priority: the writer at nice +10 and idle-most I/O priority (the trainer's default) or not.
    auto async_saves = [&](bool background_priority) {
      Async a;
      for (int r = 0; r < reps; ++r) {
        if (rank == 0) remove_tree(last);
        comm.barrier();
        const auto t0 = Clock::now();
        CheckpointContent c = content_of(s, ++step, rank);
        RankState mine = rank_state_of(s);
        snapshot_into(arena, c, mine);
        auto save = std::make_unique<AsyncCheckpointSave>(CheckpointWriter(run, rank, world, o), std::move(c),
                                                          std::move(mine), background_priority);
        const double stall = max_over_ranks(since(t0));
        // Steps while the write is in flight (every rank decides together, as the trainer's poll does).
        double sum_ms = 0;
        int n = 0;
        for (;;) {
          const bool done = save->done();
          if (comm.all_reduce(done ? 0.0 : 1.0, ReduceOp::Max) == 0.0) break;
          const auto ts = Clock::now();
          st.run();
          sum_ms += since(ts) * 1e3;
          ++n;
        }
        if (!save->error().empty()) throw std::runtime_error("bench_checkpoint_io: " + save->error());
        last = rank == 0 ? save->commit() : save->final_dir();
        comm.barrier();
        const double total = max_over_ranks(since(t0));
        const double wr = max_over_ranks(save->write_seconds());
        if (total < a.async_s) {
          a.async_s = total, a.stall_s = stall, a.write_s = wr;
          a.inflight_steps = int(-comm.all_reduce(-double(n), ReduceOp::Max));  // the fewest over the ranks
          a.inflight_ms = n > 0 ? max_over_ranks(sum_ms / n) : 0;
        }
      }
      return a;
    };
    const Async plain = async_saves(false);
    const Async niced = async_saves(true);
    const double stall_s = niced.stall_s, async_s = niced.async_s, write_s = niced.write_s,
                 inflight_ms = niced.inflight_ms;
    const int inflight_steps = niced.inflight_steps;
    comm.barrier();
    if (rank == 0) {
      remove_tree(run);
      // The CRC-32 kernel alone (a component figure): gmod's (ISA-L) and zlib's over the same 256 MiB.
      std::vector<unsigned char> buf(size_t(256) << 20);
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>((i * 2654435761u) >> 24);
      auto crc_rate = [&](auto&& fn) {
        double best = 1e30;
        for (int r = 0; r < 3; ++r) {
          const auto t0 = Clock::now();
          volatile uint32_t c = fn();
          (void)c;
          best = std::min(best, since(t0));
        }
        return double(buf.size()) / best / 1e9;
      };
      const double crc_gbps = crc_rate([&] { return crc32_bytes(buf.data(), buf.size()); });
      const double zlib_gbps = crc_rate([&] { return uint32_t(::crc32(0, buf.data(), uInt(buf.size()))); });
      const json out{{"world", world},           {"params", params},         {"bytes", bytes},
                     {"sync_save_s", sync_s},    {"load_s", load_s}, {"load_verify_s", verify_s},         {"async_stall_s", stall_s},
                     {"async_write_s", write_s}, {"async_total_s", async_s}, {"step_alone_ms", alone_ms},
                     {"step_inflight_ms", inflight_ms}, {"inflight_steps", inflight_steps}, {"threads", threads},
                     {"crc_gbps", crc_gbps}, {"zlib_crc_gbps", zlib_gbps},
                     {"step_inflight_plain_ms", plain.inflight_ms}, {"async_total_plain_s", plain.async_s}};
      std::printf("%s\n", out.dump().c_str());
    }
    return 0;
  });
}

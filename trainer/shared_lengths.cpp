// share_modality_lengths: see shared_lengths.h.
#include "trainer/shared_lengths.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

namespace gmod {

std::string SharedLengthsReport::summary() const {
  char buf[160];
  if (from_cache)
    std::snprintf(buf, sizeof buf, "modality lengths read from the cache in %.2f s", seconds);
  else
    std::snprintf(buf, sizeof buf,
                  "modality lengths parsed over the ranks in %.2f s (%zu records, %u threads here)", seconds,
                  parsed, threads);
  return buf;
}

SharedLengthsReport share_modality_lengths(const Dataset& ds, Comm& comm) {
  const auto t0 = std::chrono::steady_clock::now();
  SharedLengthsReport rep;
  const bool cached = ds.load_cached_modality_lengths();
  // One collective decides for all: a rank that could not read the cache (another node's copy of the file, a
  // cache written in between) must not leave the others waiting in an all-reduce it skips.
  const double missing = comm.all_reduce(cached ? 0.0 : 1.0, ReduceOp::Max);
  if (missing == 0.0) {
    rep.from_cache = true;
  } else {
    const int world = comm.world_size(), rank = comm.rank();
    const size_t n = ds.size();
    const size_t begin = n * size_t(rank) / size_t(world), end = n * size_t(rank + 1) / size_t(world);
    // The node's cores are shared by its ranks: each parses on its share of them.
    const double per_node = comm.all_reduce(double(comm.local_rank() + 1), ReduceOp::Max);
    rep.threads =
        std::max(1u, unsigned(std::max(1u, std::thread::hardware_concurrency()) / unsigned(per_node)));
    at::Tensor all = at::zeros({int64_t(n)}, at::TensorOptions().dtype(at::kDouble));  // exact below 2^53
    double* a = all.data_ptr<double>();
    if (cached) {
      const std::vector<int64_t>& l = ds.modality_lengths();
      for (size_t i = begin; i < end; ++i) a[i] = double(l[i]);
    } else {
      const std::vector<int64_t> part = ds.compute_modality_lengths(begin, end, rep.threads);
      rep.parsed = part.size();
      for (size_t i = begin; i < end; ++i) a[i] = double(part[i - begin]);
    }
    at::Tensor t = all.to(comm.device());
    comm.all_reduce(t, ReduceOp::Sum);
    t = t.cpu().contiguous();
    const double* s = t.data_ptr<double>();
    std::vector<int64_t> whole(n);
    for (size_t i = 0; i < n; ++i) whole[i] = int64_t(s[i]);
    rep.wrote_cache = ds.adopt_modality_lengths(std::move(whole), !cached && comm.local_rank() == 0);
  }
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace gmod

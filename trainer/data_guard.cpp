// The data guard over ranks: the counts are summed with one all-reduce of doubles.
#include "trainer/data_guard.h"

#include <algorithm>

#include "data/preflight.h"

namespace gmod {

void guard_dataset(const Dataset& ds, const SamplerConfig& sampler, const DataGuardOptions& g, Comm& comm,
                   const std::function<void(const std::string&)>& print) {
  const std::vector<int64_t> no_lengths;
  const std::vector<size_t> order =
      epoch_order(ds.size(), sampler, 0, sampler.group_by_modality_length ? ds.modality_lengths() : no_lengths);
  PreflightOptions o;
  o.records = g.records;
  o.max_bad_fraction = g.max_bad_fraction;
  o.fraction_key = "data.max_bad_fraction";
  o.order_name = g.order_name;
  o.rank = comm.rank();
  o.world_size = comm.world_size();
  o.workers = std::max(1, g.workers);
  const PreflightReport rep = preflight_check(ds, order, o, [&comm](std::vector<double>& v) {
    at::Tensor t = at::tensor(v, at::TensorOptions().dtype(at::kDouble)).to(comm.device());
    comm.all_reduce(t, ReduceOp::Sum);
    t = t.cpu().contiguous();
    std::copy(t.data_ptr<double>(), t.data_ptr<double>() + t.numel(), v.begin());
  });
  if (comm.rank() == 0) print(g.key + ": " + rep.summary());
  if (!rep.passed) throw std::runtime_error(g.key + ": " + rep.error);
}

}  // namespace gmod

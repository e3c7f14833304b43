// The trainer's data guard: data/preflight.h run over all ranks before the first step (and before ARank), on the
// first data.preflight_records records of the run's sample order (epoch 0, as the loader will draw them) and of
// eval.data. Rank 0 prints one summary line; a failing dataset stops the run on every rank with the counts per
// problem kind, the file and an example of each kind.
#pragma once

#include <functional>
#include <string>

#include "data/dataset.h"
#include "data/sampler.h"
#include "parallel/comm.h"

namespace gmod {

struct DataGuardOptions {
  std::string key;  // the config key naming the file, e.g. "data.train"
  int64_t records = 256;
  double max_bad_fraction = 0.05;
  int workers = 1;
  std::string order_name = "training order";  // for the messages
};

// Collective over comm. `sampler` gives the order (epoch 0); grouping reads the dataset's modality lengths, which
// the loader reuses. Throws std::runtime_error naming key and file when the dataset fails the guard.
void guard_dataset(const Dataset& ds, const SamplerConfig& sampler, const DataGuardOptions& options, Comm& comm,
                   const std::function<void(const std::string&)>& print);

}  // namespace gmod

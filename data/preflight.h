// The data guard before training: the first records of the run's sample order are prepared exactly as training
// will prepare them (template, truncation, images decoded), and a run whose data is unusable stops before its first
// step - with the counts per problem kind, the file and an example of each kind - instead of training on nothing.
// It fails when none of the checked records is usable, or when more than max_bad_fraction of them are not.
//
// With several ranks every rank prepares every world_size-th of the same records and `sum` adds the counts over the
// ranks (an all-reduce the caller passes; data/ knows nothing of communication), so the verdict is the same for any
// world size and the work is shared. Only rank 0 collects the examples for the message.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace gmod {

struct PreflightOptions {
  int64_t records = 256;           // first positions of `order` to check (capped at its size); -1: all of them
  double max_bad_fraction = 0.05;  // fail when bad > max_bad_fraction * checked; always fail when none is usable
  std::string fraction_key = "max_bad_fraction";  // how the caller's config names the fraction, for the message
  std::string order_name = "training order";       // what `order` is, for the messages
  int rank = 0;
  int world_size = 1;
  int workers = 1;  // threads on this rank
};

struct PreflightReport {
  std::string data_path;
  std::string order_name = "training order";
  int64_t records = 0;  // in the dataset
  int64_t checked = 0;  // all ranks together
  int64_t usable = 0;
  std::map<std::string, int64_t> bad_by_reason;  // all ranks together; only reasons that occurred
  std::vector<std::string> examples;             // rank 0, when failed: "[reason] message", first of each reason
  bool passed = true;
  std::string error;  // when !passed: file, counts per reason, the limit, the examples and what to do

  int64_t bad() const { return checked - usable; }
  // "<file>: the first 256 of 1000 records in training order checked: 250 usable, 6 not (image: 4, too_long: 2)"
  std::string summary() const;
};

// Element-wise sum of the vector over all ranks, in place (nullptr: one process).
using SumOverRanks = std::function<void(std::vector<double>&)>;

// Collective when `sum` is: every rank calls it with the same dataset, order and options (except rank).
PreflightReport preflight_check(const Dataset& ds, const std::vector<size_t>& order, const PreflightOptions& options,
                                const SumOverRanks& sum = nullptr);

}  // namespace gmod

// The modality lengths data.group_by_modality_length needs, got once per job instead of once per rank: every
// rank reads them from the dataset's side cache (`<file>.gmodidx.modality_lengths.v1`) when each one can;
// otherwise the parse is split over the ranks (rank r parses its 1/world of the records on its share of the
// node's cores), the parts are summed into the whole on every rank with one all-reduce, and one rank per node
// (node-local rank 0) writes the cache atomically beside the data for the next start.
#pragma once

#include <cstddef>
#include <string>

#include "data/dataset.h"
#include "parallel/comm.h"

namespace gmod {

struct SharedLengthsReport {
  bool from_cache = false;      // every rank read the side cache: nothing parsed
  size_t parsed = 0;            // records this rank parsed
  unsigned threads = 0;         // threads this rank parsed them on
  bool wrote_cache = false;     // this rank wrote the side cache
  double seconds = 0;           // this rank's time in the call
  std::string summary() const;  // one line for the start-up log (rank 0's view)
};

// Collective over comm (every rank calls it with the same dataset file). Afterwards ds.modality_lengths()
// returns the whole job's lengths without parsing, equal on every rank.
SharedLengthsReport share_modality_lengths(const Dataset& ds, Comm& comm);

}  // namespace gmod

// data.group_by_modality_length's lengths are got once per job (trainer/shared_lengths.h): on a cold cache
// each rank parses only its 1/world of the records, every rank ends with the same lengths (equal to a whole
// parse by one process), one rank per node writes the side cache, and the next start reads it on every rank,
// parsing nothing. Run as an MPI singleton and under mpirun at 2 and 3 ranks (ctest mpi_shared_lengths*).
#include <gtest/gtest.h>
#include <mpi.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "parallel/mpi_comm.h"
#include "tests/common/paths.h"
#include "trainer/shared_lengths.h"

using namespace gmod;

namespace {

constexpr size_t kRecords = 9001;  // not a multiple of 2 or 3: uneven slices

std::shared_ptr<MpiComm> world() {
  static auto c = std::make_shared<MpiComm>();
  return c;
}

// Rank 0's temporary directory, its path broadcast to every rank.
struct SharedDir {
  std::unique_ptr<test::TempDir> own;
  std::string path;
  SharedDir() {
    char buf[4096] = {0};
    if (world()->rank() == 0) {
      own = std::make_unique<test::TempDir>();
      std::snprintf(buf, sizeof buf, "%s", own->str().c_str());
    }
    MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
    path = buf;
  }
  ~SharedDir() { MPI_Barrier(MPI_COMM_WORLD); }  // nobody reads while rank 0 deletes
};

// Records with and without an image, 1-12 words per turn, and a malformed one every 1000.
void write_records(const std::string& path) {
  std::ofstream f(path);
  f << "[\n";
  for (size_t i = 0; i < kRecords; ++i) {
    f << (i ? ",\n" : "");
    if (i % 1000 == 999) {
      f << "{\"id\": \"bad" << i << "\", \"conversations\": 7}";
      continue;
    }
    const bool image = i % 7 != 0;
    f << "{\"id\": \"" << i << "\"" << (image ? ", \"image\": \"a.png\"" : "") << ", \"conversations\": [";
    for (int t = 0; t < 2; ++t) {
      f << (t ? ", " : "") << "{\"from\": \"" << (t ? "gpt" : "human") << "\", \"value\": \""
        << (t == 0 && image ? "<image>\\n" : "");
      for (size_t w = 0; w < 1 + (i * 31 + size_t(t) * 17) % 12; ++w) f << (w ? " " : "") << "w" << w;
      f << "\"}";
    }
    f << "]}";
  }
  f << "\n]\n";
}

Dataset open_dataset(const std::string& path, bool use_cache) {
  DatasetConfig c;
  c.data_path = path;
  c.use_index_cache = use_cache;
  return Dataset(c, load_tokenizer(test::fixture("tokenizer/sp/tokenizer.model")));
}

double sum_over_ranks(double v) { return world()->all_reduce(v, ReduceOp::Sum); }

}  // namespace

TEST(SharedLengths, ColdCacheIsParsedOnceSplitOverRanksAndWarmCacheIsNotParsed) {
  const int rank = world()->rank(), n = world()->world_size();
  SharedDir dir;
  const std::string data = dir.path + "/train.json";
  if (rank == 0) write_records(data);
  world()->barrier();
  // The reference: one process parsing every record, no cache involved.
  const std::vector<int64_t> want = open_dataset(data, false).modality_lengths();
  ASSERT_EQ(want.size(), kRecords);
  ASSERT_EQ(want[999], -1);  // malformed
  ASSERT_LT(want[7], 0);     // text-only
  ASSERT_GT(want[1], 128);   // with an image

  {
    const Dataset ds = open_dataset(data, true);
    const SharedLengthsReport rep = share_modality_lengths(ds, *world());
    EXPECT_FALSE(rep.from_cache);
    const size_t slice = kRecords * size_t(rank + 1) / size_t(n) - kRecords * size_t(rank) / size_t(n);
    EXPECT_EQ(rep.parsed, slice);
    EXPECT_EQ(ds.modality_lengths_parsed(), slice) << "rank " << rank << " parsed more than its share";
    EXPECT_EQ(sum_over_ranks(double(ds.modality_lengths_parsed())), double(kRecords)) << "parsed once in all";
    EXPECT_EQ(ds.modality_lengths(), want) << "rank " << rank;
    EXPECT_EQ(ds.modality_lengths_parsed(), slice) << "modality_lengths() parsed again after the share";
    // One node here: exactly one rank (local rank 0) wrote the cache.
    EXPECT_EQ(sum_over_ranks(rep.wrote_cache ? 1.0 : 0.0), 1.0);
    EXPECT_EQ(rep.wrote_cache, world()->local_rank() == 0);
  }
  world()->barrier();
  {
    const Dataset ds = open_dataset(data, true);
    const SharedLengthsReport rep = share_modality_lengths(ds, *world());
    EXPECT_TRUE(rep.from_cache) << "rank " << rank << ": the cache written by the first start was not read";
    EXPECT_FALSE(rep.wrote_cache);
    EXPECT_EQ(ds.modality_lengths_parsed(), 0u);
    EXPECT_EQ(ds.modality_lengths(), want) << "rank " << rank;
  }
  world()->barrier();
}

// A cache only some ranks can read (here: rank 0's Dataset ignores caches, the others read it): nobody waits
// in a collective the others skip, the lengths are the same everywhere, and only the ranks without them
// parse.
TEST(SharedLengths, CacheReadableOnSomeRanksOnlyStillAgrees) {
  const int rank = world()->rank(), n = world()->world_size();
  SharedDir dir;
  const std::string data = dir.path + "/train.json";
  if (rank == 0) {
    write_records(data);
    open_dataset(data, true).modality_lengths();  // writes the cache
  }
  world()->barrier();
  const std::vector<int64_t> want = open_dataset(data, false).modality_lengths();
  const Dataset ds = open_dataset(data, rank != 0);
  const SharedLengthsReport rep = share_modality_lengths(ds, *world());
  EXPECT_FALSE(rep.from_cache);
  const size_t slice0 = kRecords / size_t(n);
  EXPECT_EQ(ds.modality_lengths_parsed(), rank == 0 ? slice0 : 0u) << "rank " << rank;
  EXPECT_EQ(ds.modality_lengths(), want) << "rank " << rank;
  EXPECT_FALSE(rep.wrote_cache) << "rank " << rank;  // rank 0 has caching off; the others had the cache
}

// Sample order: seeded permutations, modality/length grouping, DataPosition serialisation.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>

#include "data/sampler.h"

using namespace gmod;

namespace {

bool is_permutation_of_range(std::vector<size_t> v) {
  std::sort(v.begin(), v.end());
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != i) return false;
  return true;
}

}  // namespace

TEST(Sampler, EpochOrderIsASeededPermutation) {
  SamplerConfig c;
  c.seed = 7;
  c.global_batch_size = 4;
  auto a = epoch_order(1000, c, 0), b = epoch_order(1000, c, 0), e1 = epoch_order(1000, c, 1);
  EXPECT_TRUE(is_permutation_of_range(a));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, e1);
  EXPECT_TRUE(is_permutation_of_range(e1));
  c.seed = 8;
  EXPECT_NE(epoch_order(1000, c, 0), a);
  std::vector<size_t> id(1000);
  std::iota(id.begin(), id.end(), 0);
  EXPECT_NE(a, id);
  // pinned values: the order must not change across platforms / standard libraries
  EXPECT_EQ(seeded_permutation(10, 1, 2), (std::vector<size_t>{0, 4, 3, 6, 2, 9, 7, 1, 5, 8}));
  EXPECT_TRUE(epoch_order(0, c, 0).empty());
  EXPECT_EQ(epoch_order(1, c, 3), std::vector<size_t>{0});
}

TEST(Sampler, PermutationIsRoughlyUniform) {
  // position of element 0 over many seeds: every slot hit
  std::vector<int> hits(10, 0);
  for (uint64_t s = 0; s < 2000; ++s) {
    auto p = seeded_permutation(10, s, 0);
    hits[std::find(p.begin(), p.end(), 0) - p.begin()]++;
  }
  for (int h : hits) EXPECT_GT(h, 120) << "biased shuffle";
}

TEST(Sampler, GroupByModalityLengthMakesSameModalityGroupsSortedByLength) {
  const size_t N = 203;
  std::vector<int64_t> lengths(N);
  for (size_t i = 0; i < N; ++i)
    lengths[i] = (i % 3 == 0 ? -1 : 1) * static_cast<int64_t>(10 + (i * 37) % 101);
  SamplerConfig c;
  c.seed = 3;
  c.global_batch_size = 8;
  c.group_by_modality_length = true;
  auto order = epoch_order(N, c, 0, lengths);
  ASSERT_TRUE(is_permutation_of_range(order));
  EXPECT_EQ(order, epoch_order(N, c, 0, lengths));
  EXPECT_NE(order, epoch_order(N, c, 1, lengths));
  const size_t n_mm = 135, n_lang = 68;  // i % 3 != 0 / == 0
  const size_t full_groups = n_mm / 8 + n_lang / 8;
  for (size_t g = 0; g < full_groups; ++g) {
    const bool mm = lengths[order[g * 8]] > 0;
    for (size_t k = 0; k < 8; ++k) {
      EXPECT_EQ(lengths[order[g * 8 + k]] > 0, mm) << "group " << g;
      if (k > 0) {
        EXPECT_GE(std::llabs(lengths[order[g * 8 + k - 1]]), std::llabs(lengths[order[g * 8 + k]]));
      }
    }
  }
  // a different group size gives a different order; a missing length vector is an error
  c.group_size = 16;
  EXPECT_NE(epoch_order(N, c, 0, lengths), order);
  EXPECT_THROW(epoch_order(N, c, 0, {}), std::invalid_argument);
  // one modality only
  std::vector<int64_t> only(N, 5);
  EXPECT_TRUE(is_permutation_of_range(epoch_order(N, c, 0, only)));
}

TEST(Sampler, DataPositionRoundTripsThroughJson) {
  DataPosition p{3, 1536};
  const auto j = to_json(p);
  EXPECT_EQ(j.dump(), R"({"consumed_samples":1536,"epoch":3})");
  EXPECT_EQ(data_position_from_json(nlohmann::json::parse(j.dump())), p);
  EXPECT_THROW(data_position_from_json(nlohmann::json::parse(R"({"epoch": 1})")), std::runtime_error);
  EXPECT_THROW(data_position_from_json(nlohmann::json::parse(R"({"epoch": -1, "consumed_samples": 0})")),
               std::runtime_error);
}

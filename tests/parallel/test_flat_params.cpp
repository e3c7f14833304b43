// FlatParamLayout: offsets, padding, shard ranges, pieces, JSON round trip, read_range / reshard_flat.
#include "parallel/flat_params.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

using namespace gmod;

namespace {
FlatParamLayout make(int world) {
  return FlatParamLayout({"a", "b", "c"}, {{2, 3}, {5}, {}}, world);  // 6 + 5 + 1 = 12
}
}  // namespace

TEST(FlatParamLayout, OffsetsAndPadding) {
  for (int world : {1, 2, 3, 4, 5, 7, 12, 13}) {
    FlatParamLayout l = make(world);
    EXPECT_EQ(l.total(), 12);
    EXPECT_EQ(l.padded_total(), (12 + world - 1) / world * world);
    EXPECT_EQ(l.shard_size() * world, l.padded_total());
    EXPECT_EQ(l.padding(), l.padded_total() - 12);
    int64_t covered = 0;
    for (int r = 0; r < world; ++r) {
      auto [b, e] = l.shard_range(r);
      EXPECT_EQ(b, r * l.shard_size());
      EXPECT_EQ(e - b, l.shard_size());
      auto [vb, ve] = l.valid_range(r);
      EXPECT_LE(ve, 12);
      covered += ve - vb;
    }
    EXPECT_EQ(covered, 12);
  }
  FlatParamLayout l = make(5);  // padded 15, S = 3
  EXPECT_EQ(l.entries()[1].offset, 6);
  EXPECT_EQ(l.entries()[2].offset, 11);
  EXPECT_EQ(l.entries()[2].numel, 1);
  EXPECT_EQ(l.valid_range(4), (std::pair<int64_t, int64_t>{12, 12}));  // all padding
  EXPECT_EQ(l.valid_range(3), (std::pair<int64_t, int64_t>{9, 12}));
  EXPECT_THROW(l.shard_range(5), std::runtime_error);
  EXPECT_THROW(FlatParamLayout({"a", "a"}, {{1}, {1}}, 1), std::runtime_error);
  EXPECT_THROW(make(0), std::runtime_error);
}

TEST(FlatParamLayout, Pieces) {
  FlatParamLayout l = make(1);
  auto p = l.pieces(4, 12);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].index, 0u);
  EXPECT_EQ(p[0].param_begin, 4);
  EXPECT_EQ(p[0].length, 2);
  EXPECT_EQ(p[1].index, 1u);
  EXPECT_EQ(p[1].param_begin, 0);
  EXPECT_EQ(p[1].length, 5);
  EXPECT_EQ(p[2].flat_begin, 11);
  EXPECT_TRUE(l.pieces(12, 20).empty());
  auto q = l.pieces(7, 8);
  ASSERT_EQ(q.size(), 1u);
  EXPECT_EQ(q[0].param_begin, 1);
}

TEST(FlatParamLayout, JsonRoundTrip) {
  FlatParamLayout l = make(3);
  FlatParamLayout r = FlatParamLayout::from_json(nlohmann::json::parse(l.to_json().dump()));
  EXPECT_TRUE(r.same_params(l));
  EXPECT_EQ(r.world_size(), 3);
  EXPECT_EQ(r.padded_total(), l.padded_total());
  nlohmann::json bad = l.to_json();
  bad["params"][1]["offset"] = 5;
  EXPECT_THROW(FlatParamLayout::from_json(bad), std::runtime_error);
  EXPECT_THROW(FlatParamLayout::from_json(nlohmann::json::object()), std::runtime_error);
}

TEST(FlatParamLayout, ReadRangeAndReshardExact) {
  const at::Tensor full = at::arange(12, at::kFloat) + 0.25;
  for (int w : {1, 2, 3, 5, 7}) {
    FlatParamLayout l = make(w);
    std::vector<at::Tensor> shards;
    for (int r = 0; r < w; ++r) {
      at::Tensor s = at::full({l.shard_size()}, -7.0f);  // padding garbage must never be read
      auto [vb, ve] = l.valid_range(r);
      if (vb < ve) s.narrow(0, 0, ve - vb).copy_(full.narrow(0, vb, ve - vb));
      shards.push_back(s);
    }
    EXPECT_TRUE(read_range(l, shards, 0, 12).equal(full)) << "world " << w;
    EXPECT_TRUE(read_range(l, shards, 3, 10).equal(full.narrow(0, 3, 7)));
    for (int w2 : {1, 2, 3, 4, 13}) {
      auto re = reshard_flat(l, shards, w2);
      FlatParamLayout l2 = l.with_world_size(w2);
      ASSERT_EQ(static_cast<int>(re.size()), w2);
      EXPECT_TRUE(at::cat(re).narrow(0, 0, 12).equal(full)) << w << " -> " << w2;
      EXPECT_EQ(at::cat(re).narrow(0, 12, l2.padding()).abs().sum().item<float>(), 0.0f);
      EXPECT_TRUE(read_range(l2, re, 0, 12).equal(full));
    }
  }
  FlatParamLayout l = make(2);
  EXPECT_THROW(read_range(l, {at::zeros({6})}, 0, 12), std::runtime_error);   // wrong shard count
  EXPECT_THROW(read_range(l, {at::zeros({6}), at::zeros({6})}, 0, 13), std::runtime_error);
}

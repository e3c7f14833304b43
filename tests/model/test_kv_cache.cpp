// Growable KV caches (model/kv_cache.h): appends write into the reserved buffer in place (no new allocation, the
// cache's storage unchanged) and hold what concatenation would; growth past the reservation keeps the content;
// slots never written are zeros; a fresh tensor reports no room. The oracle is at::cat of the same pieces.
#include <gtest/gtest.h>

#include "model/kv_cache.h"

using namespace gmod;

namespace {
at::Tensor piece(int64_t B, int64_t H, int64_t L, int64_t D, int seed) {
  at::manual_seed(seed);
  // [B, L, H, D] transposed: the layout the attention projections hand over.
  return at::randn({B, L, H, D}).transpose(1, 2);
}
}  // namespace

TEST(KvCache, FreshTensorsHaveNoRoomAndReserveMakesSlotViews) {
  auto k = piece(2, 3, 5, 4, 1);
  EXPECT_EQ(kv_capacity(k), 5);
  EXPECT_EQ(kv_capacity(k.contiguous()), 5);
  EXPECT_EQ(kv_capacity(at::Tensor()), 0);
  KVCache c;
  c.k = k;
  c.v = piece(2, 3, 5, 4, 2);
  const auto v0 = c.v.clone();
  kv_reserve(c, 9);
  EXPECT_EQ(c.length(), 5);
  EXPECT_EQ(kv_capacity(c.k), 9);
  EXPECT_EQ(kv_capacity(c.v), 9);
  EXPECT_TRUE(at::equal(c.k, k));
  EXPECT_TRUE(at::equal(c.v, v0));
  // A view of a buffer it does not span (the storage ends before C slots of the last sample) has no room.
  auto buf = at::zeros({2, 3, 9, 4});
  EXPECT_EQ(kv_capacity(buf.narrow(2, 0, 5)), 9);
  EXPECT_EQ(kv_capacity(buf.narrow(0, 0, 1).narrow(2, 0, 5)), 9);
  EXPECT_EQ(kv_capacity(buf.narrow(1, 0, 2).narrow(2, 0, 5)), 5) << "heads 0..1 of 3: not a slot view";
}

TEST(KvCache, AppendsWriteInPlaceAndEqualConcatenation) {
  const int64_t B = 2, H = 3, D = 4;
  KVCache c;
  auto ref_k = piece(B, H, 5, D, 1), ref_v = piece(B, H, 5, D, 2);
  kv_append(c, ref_k, ref_v);  // the prefill
  kv_reserve(c, 5 + 6);
  const void* storage = c.k.storage().data();
  for (int s = 0; s < 6; ++s) {
    auto k = piece(B, H, 1, D, 10 + s), v = piece(B, H, 1, D, 30 + s);
    kv_append(c, k, v);
    ref_k = at::cat({ref_k, k}, 2);
    ref_v = at::cat({ref_v, v}, 2);
    ASSERT_EQ(c.length(), ref_k.size(2));
    EXPECT_TRUE(at::equal(c.k, ref_k)) << "step " << s;
    EXPECT_TRUE(at::equal(c.v, ref_v)) << "step " << s;
    EXPECT_EQ(c.k.storage().data(), storage) << "step " << s << ": the cache was copied";
  }
  // Past the reservation: the buffer grows (doubling) and keeps everything.
  for (int s = 0; s < 3; ++s) {
    auto k = piece(B, H, 2, D, 50 + s), v = piece(B, H, 2, D, 70 + s);
    kv_append(c, k, v);
    ref_k = at::cat({ref_k, k}, 2);
    ref_v = at::cat({ref_v, v}, 2);
  }
  EXPECT_TRUE(at::equal(c.k, ref_k));
  EXPECT_TRUE(at::equal(c.v, ref_v));
  EXPECT_GE(kv_capacity(c.k), 2 * 11);
}

TEST(KvCache, GrowExposesZeroSlotsAndKeepsTheContent) {
  KVCache c;
  c.k = piece(2, 1, 3, 4, 1);
  c.v = piece(2, 1, 3, 4, 2);
  const auto k0 = c.k.clone();
  kv_grow(c, 4);  // no room: re-laid out
  ASSERT_EQ(c.length(), 4);
  EXPECT_TRUE(at::equal(c.k.narrow(2, 0, 3), k0));
  EXPECT_TRUE(at::equal(c.k.narrow(2, 3, 1), at::zeros({2, 1, 1, 4})));
  EXPECT_TRUE(at::equal(c.v.narrow(2, 3, 1), at::zeros({2, 1, 1, 4})));
  // Per-sample writes (MoD decode) into the widened view land in the buffer.
  c.k.select(0, 1).select(1, 3).fill_(7.0);
  kv_grow(c, 5);
  EXPECT_EQ(c.k[1][0][3][0].item<float>(), 7.0f);
  EXPECT_EQ(c.k[0][0][3][0].item<float>(), 0.0f);
  KVCache empty;
  EXPECT_THROW(kv_grow(empty, 1), std::logic_error);
}

// MpiComm collectives at the launched world size: dtypes (bf16 reduced via fp32), ops, in-place gathers, the
// chunked path for counts above the per-call limit, broadcast, scalar helper and traffic counters.
#include "parallel/mpi_comm.h"

#include <gtest/gtest.h>

using namespace gmod;

namespace {
MpiComm& comm() {
  static MpiComm c;
  return c;
}
}  // namespace

TEST(MpiComm, AllReduceDtypesAndOps) {
  const int n = comm().world_size(), r = comm().rank();
  for (auto dt : {at::kFloat, at::kDouble, at::kLong, at::kBFloat16}) {
    at::Tensor t = at::full({5}, r + 1, at::TensorOptions().dtype(dt));
    comm().all_reduce(t, ReduceOp::Sum);
    EXPECT_EQ(t.scalar_type(), dt);
    EXPECT_TRUE((t.to(at::kDouble) == n * (n + 1) / 2.0).all().item<bool>()) << dt;
    t.fill_(r + 1);
    comm().all_reduce(t, ReduceOp::Max);
    EXPECT_TRUE((t.to(at::kDouble) == n).all().item<bool>()) << dt;
    if (dt != at::kLong) {
      t.fill_(r + 1);
      comm().all_reduce(t, ReduceOp::Avg);
      EXPECT_TRUE((t.to(at::kDouble) == (n + 1) / 2.0).all().item<bool>()) << dt;
    }
  }
  EXPECT_EQ(comm().all_reduce(double(r), ReduceOp::Max), n - 1);
  EXPECT_EQ(comm().all_reduce(0.5, ReduceOp::Sum), 0.5 * n);
  at::Tensor strided = at::zeros({4, 4}).t();
  EXPECT_THROW(comm().all_reduce(strided, ReduceOp::Sum), std::runtime_error);
}

namespace {
// in[k*len + i] = 10k + i + sender_rank  ->  rank k receives sum_r (10k + i + r) (exact in bf16).
void check_reduce_scatter(MpiComm& c, at::ScalarType dt, int64_t len) {
  const int n = c.world_size(), r = c.rank();
  at::Tensor in = (at::arange(n * len, at::kDouble).remainder(len) + at::arange(n, at::kDouble)
                                                                           .repeat_interleave(len) * 10 + r)
                      .to(dt);
  at::Tensor out = at::empty({len}, in.options());
  c.reduce_scatter(in, out, ReduceOp::Sum);
  at::Tensor expect = (at::arange(len, at::kDouble) + 10 * r) * n + n * (n - 1) / 2.0;
  EXPECT_TRUE(out.to(at::kDouble).equal(expect)) << dt << " len " << len;
  c.reduce_scatter(in, out, ReduceOp::Avg);
  EXPECT_TRUE(at::allclose(out.to(at::kDouble), expect / n)) << dt;
}

void check_all_gather(MpiComm& c, at::ScalarType dt, int64_t len) {
  const int n = c.world_size(), r = c.rank();
  at::Tensor expect = (at::arange(n, at::kDouble).repeat_interleave(len) * 1000 +
                       at::arange(n * len, at::kDouble).remainder(len))
                          .to(dt);
  at::Tensor in = (at::arange(len, at::kDouble) + 1000 * r).to(dt);
  at::Tensor out = at::zeros({n * len}, in.options());
  c.all_gather(in, out);
  EXPECT_TRUE(out.equal(expect)) << dt << " len " << len;
  at::Tensor buf = at::zeros({n * len}, in.options());  // in place: our block already holds our data
  buf.narrow(0, r * len, len).copy_(in);
  at::Tensor mine = buf.narrow(0, r * len, len);
  c.all_gather(mine, buf);
  EXPECT_TRUE(buf.equal(expect)) << "in place " << dt;
}
}  // namespace

TEST(MpiComm, ReduceScatterAndAllGather) {
  for (auto dt : {at::kFloat, at::kDouble, at::kBFloat16}) {
    check_reduce_scatter(comm(), dt, 7);
    check_all_gather(comm(), dt, 7);
  }
  check_all_gather(comm(), at::kLong, 3);
}

TEST(MpiComm, ChunkedAboveMaxCount) {
  MpiComm c;
  c.set_max_count(3);
  const int n = c.world_size(), r = c.rank();
  at::Tensor t = at::arange(10, at::kFloat) + r;
  c.all_reduce(t, ReduceOp::Sum);
  EXPECT_TRUE(t.equal(at::arange(10, at::kFloat) * n + n * (n - 1) / 2.0f));
  check_reduce_scatter(c, at::kFloat, 7);
  check_reduce_scatter(c, at::kBFloat16, 8);
  check_all_gather(c, at::kFloat, 7);
  at::Tensor b = r == n - 1 ? at::arange(10, at::kBFloat16) : at::zeros({10}, at::kBFloat16);
  c.broadcast(b, n - 1);
  EXPECT_TRUE(b.equal(at::arange(10, at::kBFloat16)));
}

TEST(MpiComm, BroadcastBarrierAndStats) {
  MpiComm c;
  const int n = c.world_size(), r = c.rank();
  at::Tensor t = at::full({6}, r == 0 ? 42.0 : -1.0, at::kDouble);
  c.broadcast(t, 0);
  EXPECT_TRUE((t == 42.0).all().item<bool>());
  c.barrier();
  at::Tensor a = at::ones({8});
  c.reset_stats();
  c.all_reduce(a, ReduceOp::Sum);
  EXPECT_EQ(c.stats().calls, 1);
  EXPECT_EQ(c.stats().payload_bytes, 32);
  EXPECT_DOUBLE_EQ(c.stats().wire_bytes, n > 1 ? 32.0 * 2 * (n - 1) / n : 0.0);
}

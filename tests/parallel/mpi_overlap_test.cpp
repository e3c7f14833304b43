// Bucketed gradient reduction overlapped with backward, at the launched world size (ctest: 1, 2 and 3 ranks):
// for every ZeRO stage with several buckets and 3 accumulated micro-batches (overlap armed on the last only),
// the overlapped optimizer follows an independent reference (each gradient all-reduced whole with the
// blocking collective, then torch's AdamW formulas on whole tensors: RefAdamW) and ends bitwise equal to the
// non-overlapped one; a parameter that gets no gradient on some ranks does not hang (step() launches the rest
// in bucket order); the non-blocking collectives give bitwise the results of the blocking ones. On CUDA (NCCL,
// one GPU per rank; skipped without): the hooks fire on the comm stream and the result is bitwise that of the
// non-overlapped run, fp32 and bf16 (bench/gpu_check.sh runs it at 1 rank).
#include "parallel/data_parallel.h"
#include "parallel/mpi_comm.h"
#include "parallel/runtime.h"
#include "tests/parallel/parallel_test_util.h"

#include <gtest/gtest.h>
#ifdef GMOD_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

using namespace gmod;
using namespace gmod::testing;

// A named namespace around the file keeps its helpers apart from other files in a unity build.
namespace mpi_overlap_test {
namespace {

std::shared_ptr<MpiComm> comm() {
  static auto c = std::make_shared<MpiComm>();
  return c;
}

DataParallelOptions options(int stage, bool overlap) {
  DataParallelOptions o;
  o.stage = stage;
  o.weight_decay = 0.05;
  o.max_grad_norm = 0.4;
  o.bucket_bytes = 8;  // 2 floats: one bucket per parameter, several collectives for the larger ones
  o.overlap_comm = overlap;
  return o;
}

// This rank's slice of step `step`'s global batch in 3 micro-batches (uneven when the slice is not divisible
// by 3; each micro loss weighted by its share so the sum is the slice mean). skip_b1: b1 gets no gradient.
// opt == nullptr: a plain backward (the reference).
void backward3(const Mlp& m, DataParallelOptimizer* opt, int step, int rank, int world,
               bool skip_b1 = false) {
  auto [x, y] = global_batch(step);
  const int64_t per = kGlobalBatch / world;
  for (int i = 0; i < 3; ++i) {
    const int64_t lo = per * i / 3, hi = per * (i + 1) / 3;
    if (hi == lo) continue;
    if (i == 2 && opt) opt->set_last_micro_batch();
    at::Tensor xs = x.narrow(0, rank * per + lo, hi - lo), ys = y.narrow(0, rank * per + lo, hi - lo);
    at::Tensor h = skip_b1 ? at::tanh(at::linear(xs, m.w1)) : at::tanh(at::linear(xs, m.w1, m.b1));
    (at::mse_loss(at::linear(h, m.w2, m.b2), ys) * (double(hi - lo) / per)).backward();
  }
}

}  // namespace

TEST(OverlapMpi, MatchesAllReduceThenAdamWReferenceAndNonOverlapped) {
  const int n = comm()->world_size(), rank = comm()->rank();
  for (int stage : {0, 1, 2}) {
    const DataParallelOptions o = options(stage, true);
    Mlp a = Mlp::make(17), b = Mlp::make(17), ref = Mlp::make(17);
    DataParallelOptimizer oa(a.named(), comm(), o);
    DataParallelOptimizer ob(b.named(), comm(), options(stage, false));
    RefAdamW r{AdamWHyper{o.beta1, o.beta2, o.eps, o.weight_decay}, o.max_grad_norm};
    ASSERT_EQ(oa.buckets().size(), 4u);
    EXPECT_EQ(oa.buckets().front().second, oa.layout().padded_total());
    EXPECT_EQ(oa.buckets().back().first, 0);
    int clipped = 0;
    for (int step = 0; step < 5; ++step) {
      oa.zero_grad();
      ob.zero_grad();
      zero_grads(ref);
      backward3(a, &oa, step, rank, n);
      backward3(b, &ob, step, rank, n);
      backward3(ref, nullptr, step, rank, n);
      for (auto& t : ref.tensors()) comm()->all_reduce(t.mutable_grad(), ReduceOp::Avg);
      EXPECT_EQ(oa.buckets_launched_early(), 4) << "every bucket should start during backward";
      EXPECT_EQ(ob.buckets_launched_early(), 0);
      StepResult ra = oa.step(2e-2), rb = ob.step(2e-2);
      auto [norm, cl] = r.update(ref.tensors(), 2e-2);
      clipped += cl;
      EXPECT_NEAR(ra.grad_norm, norm, 1e-6 * norm) << "stage " << stage << " step " << step;
      EXPECT_EQ(ra.clipped, cl) << "stage " << stage << " step " << step;
      EXPECT_LT(rel_diff(a.flat(), ref.flat()), 1e-6)
          << "stage " << stage << " step " << step << " world " << n;
      EXPECT_EQ(ra.grad_norm, rb.grad_norm) << "stage " << stage << " step " << step;
      ASSERT_TRUE(a.flat().equal(b.flat())) << "stage " << stage << " step " << step << " world " << n;
    }
    EXPECT_GT(clipped, 0) << "max_grad_norm 0.4 should clip some steps (else clipping is not exercised)";
    EXPECT_GT(rel_diff(a.flat(), Mlp::make(17).flat()), 1e-3) << "the weights should have moved";
    EXPECT_NE(&oa.grad_comm(), static_cast<Comm*>(comm().get())) << "overlap reduces on its own communicator";
  }
}

TEST(OverlapMpi, ParameterWithoutGradientDoesNotHang) {
  const int n = comm()->world_size(), rank = comm()->rank();
  for (int stage : {0, 2}) {
    Mlp a = Mlp::make(23), b = Mlp::make(23);
    DataParallelOptimizer oa(a.named(), comm(), options(stage, true));
    DataParallelOptimizer ob(b.named(), comm(), options(stage, false));
    for (int step = 0; step < 3; ++step) {
      oa.zero_grad();
      ob.zero_grad();
      // b1 (bucket 2) is unused on rank 0 only, and on every rank at step 1: readiness differs across ranks.
      const bool skip = rank == 0 || step == 1;
      backward3(a, &oa, step, rank, n, skip);
      backward3(b, &ob, step, rank, n, skip);
      if (skip) {
        EXPECT_EQ(oa.buckets_launched_early(), 2) << "buckets 0, 1 only: 2 waits for b1, 3 for 2";
      }
      oa.step(2e-2);
      ob.step(2e-2);
      ASSERT_TRUE(a.flat().equal(b.flat())) << "stage " << stage << " step " << step;
    }
  }
}

// MPI may pick different algorithms for blocking and non-blocking collectives; with 3+ ranks they can add the
// contributions in another order (last-bit differences; seen for MPI_Ireduce_scatter vs MPI_Reduce_scatter_block at
// 3 ranks), so only 1-2 ranks are bitwise. What must hold everywhere: every rank gets the same all-reduce result
// (stage 0 replicas run AdamW on it independently).
TEST(OverlapMpi, NonBlockingCollectivesMatchBlocking) {
  const int n = comm()->world_size(), rank = comm()->rank();
  at::manual_seed(100 + rank);
  for (int64_t len : {7, 1000, 100003, 1 << 21}) {
    at::Tensor x = at::randn({len});
    at::Tensor blocking = x.clone(), nonblocking = x.clone();
    comm()->all_reduce(blocking, ReduceOp::Avg);
    comm()->all_reduce_start(nonblocking, ReduceOp::Avg)->wait();
    if (n <= 2) {
      EXPECT_TRUE(blocking.equal(nonblocking)) << "all_reduce, " << len << " elements";
    }
    EXPECT_LT(rel_diff(nonblocking, blocking), 1e-6);
    at::Tensor r0 = nonblocking.clone();
    comm()->broadcast(r0, 0);
    EXPECT_TRUE(r0.equal(nonblocking)) << "ranks disagree on the non-blocking all_reduce, " << len << " elements";
    // Equal blocks: reduce_scatter_v vs reduce_scatter.
    at::Tensor in = at::randn({n * len}), o1 = at::empty({len}), o2 = at::empty({len});
    comm()->reduce_scatter(in, o1, ReduceOp::Avg);
    comm()->reduce_scatter_v(in, o2, std::vector<int64_t>(n, len), ReduceOp::Avg);
    if (n <= 2) {
      EXPECT_TRUE(o1.equal(o2)) << "reduce_scatter, " << len << " elements";
    }
    EXPECT_LT(rel_diff(o2, o1), 1e-6);
  }
  // Uneven blocks (rank k gets k+1 elements) agree with the all-reduce.
  std::vector<int64_t> counts;
  int64_t total = 0, off = 0;
  for (int k = 0; k < n; ++k) counts.push_back(k + 1), total += k + 1, off += k < rank ? k + 1 : 0;
  at::Tensor in = at::arange(total, at::kFloat) * (rank + 1), out = at::empty({rank + 1});
  comm()->reduce_scatter_v(in, out, counts, ReduceOp::Sum);
  EXPECT_TRUE(out.equal(at::arange(off, off + rank + 1, at::kFloat) * (n * (n + 1) / 2)));
}

// NCCL: the post-accumulate hooks armed by set_last_micro_batch() start every bucket on the dedicated comm stream
// during the last backward; weights bitwise equal to the non-overlapped optimizer's, for each stage, fp32 and bf16.
TEST(OverlapNccl, HooksFireAndMatchNonOverlappedOnCuda) {
#ifndef GMOD_WITH_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  const int n = comm()->world_size(), rank = comm()->rank();
  const bool have = at::hasCUDA() && static_cast<int>(c10::cuda::device_count()) >= n;
  if (comm()->all_reduce(have ? 0.0 : 1.0, ReduceOp::Max) != 0.0) GTEST_SKIP() << "needs one CUDA device per rank";
  static std::shared_ptr<Comm> nccl = make_comm(at::Device(at::kCUDA));
  for (int stage : {0, 1, 2}) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + (dtype == at::kFloat ? " fp32" : " bf16"));
      Mlp init = Mlp::make(23, dtype);
      Mlp a = init.to(nccl->device()), b = init.to(nccl->device());
      DataParallelOptions oa_opts = options(stage, true), ob_opts = options(stage, false);
      DataParallelOptimizer oa(a.named(), nccl, oa_opts), ob(b.named(), nccl, ob_opts);
      for (int step = 0; step < 4; ++step) {
        oa.zero_grad();
        ob.zero_grad();
        auto [x, y] = global_batch(step);
        const int64_t per = kGlobalBatch / n, mb = per / 2;
        for (int i = 0; i < 2; ++i) {
          if (i == 1) oa.set_last_micro_batch();
          at::Tensor xs = x.narrow(0, rank * per + i * mb, mb).to(nccl->device());
          at::Tensor ys = y.narrow(0, rank * per + i * mb, mb).to(nccl->device());
          (a.loss(xs, ys) / 2).backward();
          (b.loss(xs, ys) / 2).backward();
        }
        EXPECT_EQ(oa.buckets_launched_early(), static_cast<int>(oa.buckets().size())) << "step " << step;
        StepResult ra = oa.step(2e-2), rb = ob.step(2e-2);
        EXPECT_EQ(ra.grad_norm, rb.grad_norm) << "step " << step;
        ASSERT_TRUE(a.flat().equal(b.flat())) << "step " << step;
      }
    }
  }
#endif
}

}  // namespace mpi_overlap_test

// When ZeRO-2 releases a gradient bucket (parallel/bucket_release.h): on CUDA as soon as its reduce-scatter
// is enqueued (the armed last backward ends holding no bucket), on the CPU (MPI-style non-blocking
// collectives) only when step() retires the reduction (the backward ends holding every bucket). Both give the
// same update as a run without overlap. Single process (LocalComm); the CUDA half skips without a GPU.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include "parallel/bucket_release.h"
#include "parallel/data_parallel.h"
#include "parallel/local_comm.h"
#include "tests/parallel/parallel_test_util.h"

using namespace gmod;
using namespace gmod::testing;

namespace {

DataParallelOptions zero2(bool overlap) {
  DataParallelOptions o;
  o.stage = 2;
  o.overlap_comm = overlap;
  o.bucket_bytes = 2 * 4;  // one bucket per parameter (4)
  o.lr = 1e-2;
  return o;
}

// Runs 2 steps of 2 micro-batches; returns the grad_buffer bytes held right after the armed backward of the
// last step, and the final weights.
std::pair<int64_t, at::Tensor> run(const at::Device& dev, bool overlap) {
  Mlp m = Mlp::make(7).to(dev);
  DataParallelOptimizer opt(m.named(), std::make_shared<LocalComm>(dev), zero2(overlap));
  EXPECT_EQ(opt.buckets().size(), 4u);
  int64_t held = -1;
  for (int step = 0; step < 2; ++step) {
    auto [x, y] = global_batch(step);
    for (int i = 0; i < 2; ++i) {
      if (i == 1) opt.set_last_micro_batch();
      (m.loss(x.narrow(0, 6 * i, 6).to(dev), y.narrow(0, 6 * i, 6)) / 2).backward();
    }
    held = opt.memory_held().grad_buffer;
    opt.step(1e-2);
    opt.zero_grad();
  }
  return {held, m.flat()};
}

}  // namespace

TEST(BucketRelease, RuleIsStageTwoOnStreamOrderedDevices) {
  EXPECT_TRUE(release_bucket_at_launch(2, at::Device(at::kCUDA, 0)));
  EXPECT_FALSE(release_bucket_at_launch(2, at::Device(at::kCPU)));
  for (int stage : {0, 1}) EXPECT_FALSE(release_bucket_at_launch(stage, at::Device(at::kCUDA, 0)));
}

TEST(BucketRelease, CpuKeepsEveryBucketUntilStep) {
  const auto [held, w] = run(at::Device(at::kCPU), true);
  EXPECT_EQ(held, 4 * Mlp::kParams) << "MPI-style collectives read the bucket until wait(): all held";
  EXPECT_TRUE(w.equal(run(at::Device(at::kCPU), false).second));
}

TEST(BucketRelease, CudaReleasesEachBucketWhenItsReduceScatterIsEnqueued) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const at::Device cuda(at::kCUDA, 0);
  const auto [held, w] = run(cuda, true);
  EXPECT_EQ(held, 0) << "every bucket was launched (and released) by the armed backward's hooks";
  const auto [held_no_overlap, w_ref] = run(cuda, false);
  EXPECT_EQ(held_no_overlap, 4 * Mlp::kParams) << "without overlap nothing is launched before step()";
  EXPECT_TRUE(w.equal(w_ref)) << "releasing early changes nothing in the update";
}

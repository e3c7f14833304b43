// Ordering of the two communicators of DataParallelOptimizer (issue 19): with overlap_comm the bucket reductions run
// on grad_comm(), a duplicate of comm(), and may still be in flight when backward returns. A collective on comm()
// issued then (the trainer's step statistics) would run while they do; NCCL does not guarantee progress for two
// communicators' collectives at once. all_reduce_after_gradients() (what the trainer uses) drains the buckets first.
// Checked through a Comm that forwards every call to the real MpiComm and records, for each collective on comm(),
// how many bucket collectives were in flight when it started: always 0, and the results are right. At the launched
// world size (ctest: 1, 2 and 3 ranks), every ZeRO stage.
#include "parallel/data_parallel.h"
#include "parallel/mpi_comm.h"
#include "tests/parallel/parallel_test_util.h"

#include <gtest/gtest.h>

#include <functional>

using namespace gmod;
using namespace gmod::testing;

// A named namespace around the file keeps its helpers apart from other files in a unity build.
namespace mpi_order_test {
namespace {

// Forwards everything to a real MpiComm; all_reduce/broadcast/all_gather/barrier record probe() first.
class RecordingComm final : public Comm {
 public:
  explicit RecordingComm(std::shared_ptr<Comm> real) : real_(std::move(real)) {}
  std::function<size_t()> probe;
  std::vector<size_t> seen;  // probe() at the start of every collective on this communicator

  int rank() const override { return real_->rank(); }
  int world_size() const override { return real_->world_size(); }
  int local_rank() const override { return real_->local_rank(); }
  at::Device device() const override { return real_->device(); }
  std::string backend() const override { return real_->backend(); }
  using Comm::all_reduce;
  void all_reduce(at::Tensor& t, ReduceOp op) override {
    record();
    real_->all_reduce(t, op);
  }
  void reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override {
    record();
    real_->reduce_scatter(in, out, op);
  }
  void all_gather(const at::Tensor& in, at::Tensor& out) override {
    record();
    real_->all_gather(in, out);
  }
  void broadcast(at::Tensor& t, int root) override {
    record();
    real_->broadcast(t, root);
  }
  void barrier() override {
    record();
    real_->barrier();
  }
  std::shared_ptr<Comm> duplicate() const override { return real_->duplicate(); }  // the buckets' communicator

 private:
  void record() {
    if (probe) seen.push_back(probe());
  }
  std::shared_ptr<Comm> real_;
};

std::shared_ptr<MpiComm> world() {
  static auto c = std::make_shared<MpiComm>();
  return c;
}

}  // namespace

TEST(CommOrderMpi, StepStatisticsWaitForTheBucketReductions) {
  const int n = world()->world_size(), rank = world()->rank();
  for (int stage : {0, 1, 2}) {
    auto rec = std::make_shared<RecordingComm>(world());
    Mlp m = Mlp::make(23);
    DataParallelOptions o;
    o.stage = stage;
    o.bucket_bytes = 8;  // one bucket per parameter: several in flight after backward
    o.overlap_comm = true;
    DataParallelOptimizer opt(m.named(), rec, o);
    rec->probe = [&opt] { return opt.reductions_in_flight(); };
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      auto [x, y] = global_batch(step);
      const int64_t per = kGlobalBatch / n;
      opt.set_last_micro_batch();
      m.loss(x.narrow(0, rank * per, per), y.narrow(0, rank * per, per)).backward();
      // The hazard exists: backward launched every bucket and they are still in flight.
      ASSERT_EQ(opt.buckets_launched_early(), 4) << "stage " << stage;
      ASSERT_GT(opt.reductions_in_flight(), 0u) << "stage " << stage;
      rec->seen.clear();
      at::Tensor stats = at::full({2}, double(rank + 1), at::kDouble);
      opt.all_reduce_after_gradients(stats, ReduceOp::Sum);
      EXPECT_EQ(stats[0].item<double>(), n * (n + 1) / 2.0);
      ASSERT_EQ(rec->seen.size(), 1u);
      EXPECT_EQ(rec->seen[0], 0u) << "stage " << stage << ": the statistics all-reduce on comm() started while "
                                  << rec->seen[0] << " bucket collectives were in flight on grad_comm()";
      rec->seen.clear();
      const StepResult r = opt.step(1e-2);
      EXPECT_TRUE(std::isfinite(r.grad_norm));
      for (size_t s : rec->seen) EXPECT_EQ(s, 0u) << "stage " << stage << ": a collective of step() overlapped buckets";
    }
  }
}

}  // namespace mpi_order_test

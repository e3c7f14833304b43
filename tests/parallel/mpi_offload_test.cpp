// Optimizer offload in DataParallelOptimizer at the launched world size (ctest: 1, 2 and 3 ranks; P = 59,
// uneven shards): for ZeRO-0/1/2, fp32 and bf16 parameters, two accumulated micro-batches, global-norm
// clipping, weight decay on the weights only and a non-finite gradient on the last rank at one step, an
// offloaded run and a device-resident one give after every step bitwise the same parameters, the same
// norm/clip/skip verdicts and the same optimizer state; the offloaded state is reported as host memory; a
// checkpoint taken with offload resumes without it and the reverse, bitwise like an uninterrupted run.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "parallel/data_parallel.h"
#include "parallel/mpi_comm.h"
#include "tests/parallel/parallel_test_util.h"

using namespace gmod;
using namespace gmod::testing;

namespace {

std::shared_ptr<MpiComm> world() {
  static auto c = std::make_shared<MpiComm>();
  return c;
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  const at::ScalarType bits = a.element_size() == 4 ? at::kInt : at::kShort;
  return a.contiguous().view(bits).equal(b.contiguous().view(bits));
}

DataParallelOptions options(int stage, bool offload) {
  DataParallelOptions o;
  o.stage = stage;
  o.weight_decay = 0.05;
  o.max_grad_norm = 0.4;
  o.bucket_bytes = 48;                   // several buckets even for 59 parameters
  o.decay = {true, false, true, false};  // fc1.weight, fc1.bias, fc2.weight, fc2.bias
  o.offload = offload;
  return o;
}

// One step of both runs with the same local gradients; step `nan_step` gets a NaN on the last rank.
void step_both(Mlp& a, DataParallelOptimizer& oa, Mlp& b, DataParallelOptimizer& ob, int step, int nan_step) {
  const int rank = world()->rank(), n = world()->world_size();
  for (auto* pr : {&oa, &ob}) pr->zero_grad();
  local_backward(a, step, rank, n);
  local_backward(b, step, rank, n);
  if (step == nan_step && rank == n - 1)
    for (Mlp* m : {&a, &b}) m->w2.mutable_grad()[0][0] = std::numeric_limits<float>::quiet_NaN();
  const StepResult ra = oa.step(2e-2), rb = ob.step(2e-2);
  EXPECT_TRUE(ra.grad_norm == rb.grad_norm || (std::isnan(ra.grad_norm) && std::isnan(rb.grad_norm)))
      << "step " << step << ": norm " << ra.grad_norm << " vs " << rb.grad_norm;
  EXPECT_EQ(ra.clipped, rb.clipped) << "step " << step;
  EXPECT_EQ(ra.skipped, rb.skipped) << "step " << step;
}

void expect_same_state(const DataParallelOptimizer& a, const DataParallelOptimizer& b,
                       const std::string& what) {
  const AdamWShardState sa = a.state_dict(), sb = b.state_dict();
  EXPECT_EQ(sa.step, sb.step) << what;
  EXPECT_TRUE(same_bits(sa.master, sb.master)) << what << ": master";
  EXPECT_TRUE(same_bits(sa.exp_avg, sb.exp_avg)) << what << ": exp_avg";
  EXPECT_TRUE(same_bits(sa.exp_avg_sq, sb.exp_avg_sq)) << what << ": exp_avg_sq";
}

}  // namespace

TEST(OffloadMpi, SameParametersAndStateAsDeviceResident) {
  const int n = world()->world_size();
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16})
    for (int stage : {0, 1, 2}) {
      const std::string what = "stage " + std::to_string(stage) + " " + c10::toString(dtype) + " at " +
                               std::to_string(n) + " ranks";
      Mlp a = Mlp::make(42, dtype), b = Mlp::make(42, dtype);
      DataParallelOptimizer oa(a.named(), world(), options(stage, true));
      DataParallelOptimizer ob(b.named(), world(), options(stage, false));
      const int64_t S = stage == 0 ? Mlp::kParams : (Mlp::kParams + n - 1) / n;
      EXPECT_EQ(oa.memory_held().optimizer_state, 0) << what;
      EXPECT_EQ(oa.memory_held().host_state, 12 * S) << what;
      EXPECT_EQ(ob.memory_held().host_state, 0) << what;
      EXPECT_EQ(DataParallelOptimizer::memory_plan(Mlp::kParams, n, dtype, oa.options(), true).host_state,
                12 * S)
          << what;
      for (int step = 0; step < 5; ++step) {
        step_both(a, oa, b, ob, step, /*nan_step=*/2);
        EXPECT_TRUE(same_bits(a.flat(), b.flat())) << what << ", step " << step;
        expect_same_state(oa, ob, what + ", step " + std::to_string(step));
      }
      EXPECT_EQ(oa.skipped_steps(), 1) << what;
      EXPECT_EQ(oa.step_count(), 4) << what;
    }
}

TEST(OffloadMpi, CheckpointsMoveBetweenOffloadAndDeviceResident) {
  const int rank = world()->rank(), n = world()->world_size();
  for (int stage : {1, 2}) {
    Mlp ref = Mlp::make(7);
    DataParallelOptimizer oref(ref.named(), world(), options(stage, false));
    for (int step = 0; step < 6; ++step) {
      oref.zero_grad();
      local_backward(ref, step, rank, n);
      oref.step(2e-2);
    }
    for (bool first_offloaded : {true, false}) {
      Mlp a = Mlp::make(7);
      DataParallelOptimizer oa(a.named(), world(), options(stage, first_offloaded));
      for (int step = 0; step < 3; ++step) {
        oa.zero_grad();
        local_backward(a, step, rank, n);
        oa.step(2e-2);
      }
      AdamWShardState saved = oa.state_dict();
      for (auto* t : {&saved.master, &saved.exp_avg, &saved.exp_avg_sq}) *t = t->clone();
      Mlp b = Mlp::make(99);  // other initial values: the state's master overwrites them
      DataParallelOptimizer ob(b.named(), world(), options(stage, !first_offloaded));
      ob.load_state_dict(saved);
      for (int step = 3; step < 6; ++step) {
        ob.zero_grad();
        local_backward(b, step, rank, n);
        ob.step(2e-2);
      }
      const std::string what = "stage " + std::to_string(stage) +
                               (first_offloaded ? ", offload -> device" : ", device -> offload");
      EXPECT_TRUE(same_bits(b.flat(), ref.flat())) << what;
      expect_same_state(ob, oref, what);
    }
  }
}

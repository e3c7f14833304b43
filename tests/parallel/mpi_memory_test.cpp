// Optimizer memory at the launched world size (ctest: 1, 2 and 3 ranks), measured by counting the bytes of every live
// CPU tensor (a counting allocator installed in front of LibTorch's): after step() a ZeRO-2 rank holds no gradient
// buffer, only its ceil(P/N) fp32 averaged-gradient shard (and 12 bytes/element of optimizer state), for fp32 and bf16
// parameters, with and without accumulate_fp32 and overlap, over several accumulation windows; the released buckets
// come back at the next backward and training stays bitwise identical with and without overlap. The live bytes equal
// DataParallelOptimizer::memory_plan exactly, for stages 0/1/2.
#include "parallel/data_parallel.h"
#include "parallel/mpi_comm.h"
#include "tests/parallel/parallel_test_util.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstring>

using namespace gmod;
using namespace gmod::testing;

// A named namespace around the file keeps its helpers apart from other files in a unity build.
namespace mpi_memory_test {
namespace {

std::shared_ptr<MpiComm> comm() {
  static auto c = std::make_shared<MpiComm>();
  return c;
}

// Every CPU tensor allocation passes through here once installed (it stays installed for the rest of the process:
// tensors it allocated are freed through it).
class CountingAllocator final : public c10::Allocator {
 public:
  static CountingAllocator& get() {
    static CountingAllocator* a = [] {
      auto* x = new CountingAllocator(c10::GetCPUAllocator());
      c10::SetCPUAllocator(x, /*priority=*/100);
      return x;
    }();
    return *a;
  }
  int64_t live() const { return live_.load(); }

  c10::DataPtr allocate(size_t n) override {
    auto* ctx = new Block{base_->allocate(n), n, this};
    live_ += int64_t(n);
    return {ctx->ptr.get(), ctx, &Block::free, c10::Device(c10::kCPU)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

 private:
  struct Block {
    c10::DataPtr ptr;
    size_t n;
    CountingAllocator* owner;
    static void free(void* p) {
      auto* b = static_cast<Block*>(p);
      b->owner->live_ -= int64_t(b->n);
      delete b;
    }
  };
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  c10::Allocator* base_;
  std::atomic<int64_t> live_{0};
};

// P = 3 * 4099 + 1000 + 7 = 13304 parameters in 5 tensors (uneven shards at 3 ranks), several buckets.
struct Params {
  std::vector<at::Tensor> w;
  static Params make(at::ScalarType dtype) {
    at::manual_seed(5);
    Params p;
    for (int64_t numel : {4099, 1000, 4099, 7, 4099})
      p.w.push_back((at::randn({numel}) * 0.3).to(dtype).requires_grad_());
    return p;
  }
  static constexpr int64_t kParams = 3 * 4099 + 1000 + 7;
  DataParallelOptimizer::NamedParams named() const {
    DataParallelOptimizer::NamedParams v;
    for (size_t i = 0; i < w.size(); ++i) v.emplace_back("w" + std::to_string(i), w[i]);
    return v;
  }
  // Rank- and micro-batch-dependent quadratic loss: every element gets a gradient.
  void backward(int step, int micro, int rank) const {
    at::Tensor loss = at::zeros({}, at::kFloat);
    for (size_t i = 0; i < w.size(); ++i) {
      at::manual_seed(100 * step + 10 * micro + rank + 1000 * int(i));
      at::Tensor target = at::randn({w[i].numel()});
      loss = loss + (w[i].to(at::kFloat) - target).pow(2).mean();
    }
    loss.backward();
  }
  at::Tensor flat() const {
    std::vector<at::Tensor> v;
    for (const auto& t : w) v.push_back(t.detach().to(at::kFloat));
    return at::cat(v);
  }
};

DataParallelOptions options(int stage, bool overlap, bool acc32) {
  DataParallelOptions o;
  o.stage = stage;
  o.overlap_comm = overlap;
  o.accumulate_fp32 = acc32;
  o.weight_decay = 0.01;
  o.max_grad_norm = 1.0;
  o.bucket_bytes = 8 << 10;  // ~8 KiB: several buckets, the 4099-element tensors in several chunks
  return o;
}

std::string describe(int stage, at::ScalarType dtype, bool overlap, bool acc32) {
  return "stage " + std::to_string(stage) + " " + c10::toString(dtype) + (overlap ? " overlap" : "") +
         (acc32 ? " accumulate_fp32" : "") + " world " + std::to_string(comm()->world_size());
}

}  // namespace

TEST(ZeroMemoryMpi, Stage2HoldsOnlyItsGradientShardAtStepTime) {
  CountingAllocator& alloc = CountingAllocator::get();
  const int n = comm()->world_size(), rank = comm()->rank();
  const int64_t P = Params::kParams, S = (P + n - 1) / n, padded = S * n;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (bool acc32 : {false, true}) {
      Params a = Params::make(dtype), b = Params::make(dtype);
      const int64_t bp = int64_t(c10::elementSize(dtype));
      const int64_t base = alloc.live();  // both models' parameters
      DataParallelOptimizer oa(a.named(), comm(), options(2, true, acc32));
      DataParallelOptimizer ob(b.named(), comm(), options(2, false, acc32));
      const std::string what = describe(2, dtype, true, acc32);
      const DpMemory during = DataParallelOptimizer::memory_plan(P, n, dtype, oa.options(), false);
      const DpMemory at_step = DataParallelOptimizer::memory_plan(P, n, dtype, oa.options(), true);
      EXPECT_EQ(at_step.grad_buffer + at_step.fp32_accum, 0);
      EXPECT_EQ(at_step.reduced_grad, 4 * S);
      for (int step = 0; step < 3; ++step) {
        oa.zero_grad();
        ob.zero_grad();
        for (int micro = 0; micro < 3; ++micro) {
          if (micro == 2) oa.set_last_micro_batch(), ob.set_last_micro_batch();
          a.backward(step, micro, rank);
          b.backward(step, micro, rank);
        }
        // Backward: every bucket is allocated again (released ones were re-created by the gradient hooks).
        EXPECT_EQ(ob.memory_held().total(), during.total()) << what << " step " << step;
        std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> grads;
        for (const auto& t : b.w) {
          ASSERT_TRUE(t.grad().defined()) << what;
          grads.push_back(t.grad().storage().getWeakStorageImpl());
        }
        const StepResult ra = oa.step(1e-2), rb = ob.step(1e-2);
        EXPECT_FALSE(rb.skipped);
        ASSERT_TRUE(a.flat().equal(b.flat())) << what << " step " << step << ": overlap changed the result";
        EXPECT_EQ(ra.grad_norm, rb.grad_norm);
        // At step time: no gradient buffer, only the fp32 shard. The allocator agrees with memory_held().
        for (const auto* o : {&oa, &ob}) {
          const DpMemory held = o->memory_held();
          EXPECT_EQ(held.grad_buffer, 0) << what << " step " << step;
          EXPECT_EQ(held.fp32_accum, 0) << what << " step " << step;
          EXPECT_EQ(held.reduced_grad, 4 * S) << what;
          EXPECT_EQ(held.total(), at_step.total()) << what;
        }
        for (const auto& t : b.w) EXPECT_FALSE(t.grad().defined()) << what << ": .grad kept after the reduction";
        for (const auto& g : grads) EXPECT_EQ(g.use_count(), 0u) << what << ": a gradient bucket is still alive";
        // Two optimizers; their parameters moved into padded flat buffers (the old storages are freed).
        EXPECT_EQ(alloc.live() - base, 2 * (at_step.total() + (padded - P) * bp))
            << what << " step " << step << ": live CPU tensor bytes differ from memory_plan";
      }
      if (rank == 0 && dtype == at::kBFloat16 && acc32)
        std::printf("ZeRO-2 world %d, P = %lld bf16 + accumulate_fp32: %lld B during backward, %lld B at step time "
                    "(gradient %lld -> 0, fp32 accumulation %lld -> 0, fp32 shard %lld, state %lld)\n",
                    n, (long long)P, (long long)during.total(), (long long)at_step.total(),
                    (long long)during.grad_buffer, (long long)during.fp32_accum, (long long)at_step.reduced_grad,
                    (long long)at_step.optimizer_state);
    }
  }
}

// Stage 0/1 keep their gradients (that is what stage 2 removes); the plan matches the live bytes there too, and a
// bf16 stage-1 rank holds only its fp32 shard of the averaged gradient.
TEST(ZeroMemoryMpi, LiveBytesMatchThePlanAtEveryStage) {
  CountingAllocator& alloc = CountingAllocator::get();
  const int n = comm()->world_size(), rank = comm()->rank();
  const int64_t P = Params::kParams, S = (P + n - 1) / n, padded = S * n;
  for (int stage : {0, 1, 2}) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      Params a = Params::make(dtype);
      const int64_t base = alloc.live();
      DataParallelOptimizer opt(a.named(), comm(), options(stage, false, false));
      const std::string what = describe(stage, dtype, false, false);
      const DpMemory plan = DataParallelOptimizer::memory_plan(P, n, dtype, opt.options(), true);
      opt.zero_grad();
      a.backward(0, 0, rank);
      opt.step(1e-2);
      EXPECT_EQ(opt.memory_held().total(), plan.total()) << what;
      EXPECT_EQ(alloc.live() - base, plan.total() + (padded - P) * int64_t(c10::elementSize(dtype))) << what;
      if (stage == 1 && dtype == at::kBFloat16) {
        EXPECT_EQ(plan.reduced_grad, 4 * S) << "bf16 stage 1: only the owned fp32 shard";
      }
      if (rank == 0)
        std::printf("%s: %lld B at step time (gradient %lld, fp32 averaged gradient %lld, state %lld)\n",
                    what.c_str(), (long long)plan.total(), (long long)plan.grad_buffer, (long long)plan.reduced_grad,
                    (long long)plan.optimizer_state);
    }
  }
}

}  // namespace mpi_memory_test

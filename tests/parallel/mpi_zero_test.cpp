// DataParallelOptimizer at the launched world size (ctest runs 1, 2 and 3 ranks; P = 59 so shards are uneven):
// every stage matches the unsharded reference trained on the whole batch in one process, optimizer memory is
// 12 * ceil(P/N) bytes, the clip norm is the unsharded norm, a NaN on one rank skips the step everywhere, bf16
// params keep fp32 masters, and optimizer state reshards exactly (N -> N+1 -> N, N -> 1 resumed locally, and
// (N-1) -> N resumed by this job from a sub-communicator run).
#include "parallel/data_parallel.h"
#include "parallel/local_comm.h"
#include "parallel/mpi_comm.h"
#include "parallel/runtime.h"
#include "tests/parallel/parallel_test_util.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <limits>
#ifdef GMOD_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

using namespace gmod;
using namespace gmod::testing;

namespace {

std::shared_ptr<MpiComm> world() {
  static auto c = std::make_shared<MpiComm>();
  return c;
}

// True on every rank iff cond holds on every rank.
bool all_ranks(bool cond) { return world()->all_reduce(cond ? 0.0 : 1.0, ReduceOp::Max) == 0.0; }

// Max over ranks of |w - w_rank0|.
double spread_across_ranks(const at::Tensor& w) {
  at::Tensor r0 = w.clone();
  world()->broadcast(r0, 0);
  return world()->all_reduce((w - r0).abs().max().item<double>(), ReduceOp::Max);
}

DataParallelOptions options(int stage) {
  DataParallelOptions o;
  o.stage = stage;
  o.weight_decay = 0.05;
  o.max_grad_norm = 0.4;
  o.bucket_bytes = 48;  // several buckets even for 59 parameters
  return o;
}

void train(Mlp& m, DataParallelOptimizer& opt, int from, int to, int rank, int nranks) {
  for (int step = from; step < to; ++step) {
    opt.zero_grad();
    local_backward(m, step, rank, nranks);
    opt.step(2e-2);
  }
}

void train_ref(Mlp& m, RefAdamW& r, int from, int to) {
  for (int step = from; step < to; ++step) {
    zero_grads(m);
    local_backward(m, step, 0, 1, 1);
    r.update(m.tensors(), 2e-2);
  }
}

// Every rank's state, rebuilt on every rank (each state tensor all-gathered).
std::vector<AdamWShardState> gather_states(const DataParallelOptimizer& opt) {
  const int n = world()->world_size();
  AdamWShardState mine = opt.state_dict();
  std::vector<AdamWShardState> all(n);
  for (auto field : {&AdamWShardState::master, &AdamWShardState::exp_avg, &AdamWShardState::exp_avg_sq}) {
    at::Tensor buf = at::empty({n * (mine.*field).numel()}, at::kFloat);
    world()->all_gather(mine.*field, buf);
    for (int r = 0; r < n; ++r) all[r].*field = buf.view({n, -1})[r].clone();
  }
  for (int r = 0; r < n; ++r) {
    all[r].layout = mine.layout;
    all[r].stage = mine.stage;
    all[r].rank = r;
    std::tie(all[r].begin, all[r].end) = mine.layout.shard_range(r);
    all[r].step = mine.step;
  }
  return all;
}

}  // namespace

TEST(ZeroMpi, AllStagesMatchUnshardedReference) {
  const int n = world()->world_size(), rank = world()->rank();
  for (int stage : {0, 1, 2}) {
    DataParallelOptions o = options(stage);
    Mlp dp = Mlp::make(11), ref = Mlp::make(11);
    DataParallelOptimizer opt(dp.named(), world(), o);
    RefAdamW r{AdamWHyper{o.beta1, o.beta2, o.eps, o.weight_decay}, o.max_grad_norm};
    const int64_t expect_bytes = stage == 0 ? 12 * Mlp::kParams : 12 * ((Mlp::kParams + n - 1) / n);
    EXPECT_EQ(opt.optimizer_state_bytes(), expect_bytes) << "stage " << stage;
    int clipped = 0;
    for (int step = 0; step < 6; ++step) {
      opt.zero_grad();
      zero_grads(ref);
      local_backward(dp, step, rank, n);
      local_backward(ref, step, 0, 1, 1);
      StepResult s = opt.step(2e-2);
      auto [norm, cl] = r.update(ref.tensors(), 2e-2);
      EXPECT_NEAR(s.grad_norm, norm, 1e-6 * norm) << "stage " << stage << " step " << step;
      EXPECT_EQ(s.clipped, cl) << "stage " << stage << " step " << step;
      EXPECT_FALSE(s.skipped);
      clipped += cl;
    }
    EXPECT_GT(clipped, 0);
    EXPECT_LT(rel_diff(dp.flat(), ref.flat()), 1e-6) << "stage " << stage << " world " << n;
    EXPECT_EQ(spread_across_ranks(dp.flat()), 0.0) << "ranks disagree, stage " << stage;
  }
}

// Biases excluded from weight decay (the trainer's default rule), every stage: equal to torch.optim.AdamW with two
// parameter groups (RefAdamW with per-tensor decay) and different from decaying everything.
TEST(ZeroMpi, WeightDecayGroupsMatchReference) {
  const int n = world()->world_size(), rank = world()->rank();
  for (int stage : {0, 1, 2}) {
    DataParallelOptions o = options(stage);
    o.weight_decay = 0.5;  // large, so that decaying the biases would show
    o.decay = {true, false, true, false};  // fc1.weight, fc1.bias, fc2.weight, fc2.bias
    Mlp dp = Mlp::make(13), ref = Mlp::make(13), all = Mlp::make(13);
    DataParallelOptimizer opt(dp.named(), world(), o);
    RefAdamW r{AdamWHyper{o.beta1, o.beta2, o.eps, o.weight_decay}, o.max_grad_norm};
    r.decay = o.decay;
    RefAdamW r_all{AdamWHyper{o.beta1, o.beta2, o.eps, o.weight_decay}, o.max_grad_norm};
    for (int step = 0; step < 5; ++step) {
      opt.zero_grad();
      zero_grads(ref);
      zero_grads(all);
      local_backward(dp, step, rank, n);
      local_backward(ref, step, 0, 1, 1);
      local_backward(all, step, 0, 1, 1);
      opt.step(2e-2);
      r.update(ref.tensors(), 2e-2);
      r_all.update(all.tensors(), 2e-2);
    }
    EXPECT_LT(rel_diff(dp.flat(), ref.flat()), 1e-6) << "stage " << stage << " world " << n;
    EXPECT_GT(rel_diff(dp.flat(), all.flat()), 1e-3) << "biases were decayed, stage " << stage;
    EXPECT_EQ(spread_across_ranks(dp.flat()), 0.0);
  }
}

TEST(ZeroMpi, NanOnOneRankSkipsOnAllRanks) {
  const int n = world()->world_size(), rank = world()->rank();
  for (int stage : {0, 1, 2}) {
    Mlp m = Mlp::make(5);
    DataParallelOptimizer opt(m.named(), world(), options(stage));
    train(m, opt, 0, 2, rank, n);
    opt.zero_grad();
    local_backward(m, 2, rank, n);
    if (rank == n - 1) {  // flat element 0: owned by rank 0 under ZeRO
      c10::NoGradGuard ng;
      m.w1.mutable_grad()[0][0] = std::numeric_limits<float>::quiet_NaN();
    }
    const at::Tensor before = m.flat();
    StepResult s = opt.step(2e-2);
    EXPECT_TRUE(all_ranks(s.skipped)) << "stage " << stage;
    EXPECT_TRUE(m.flat().equal(before)) << "stage " << stage;
    EXPECT_EQ(opt.skipped_steps(), 1);
    EXPECT_EQ(opt.step_count(), 2);
    train(m, opt, 3, 4, rank, n);  // recovers
    EXPECT_TRUE(all_ranks(at::isfinite(m.flat()).all().item<bool>()));
    EXPECT_EQ(opt.step_count(), 3);
  }
}

TEST(ZeroMpi, Bf16ParamsKeepFp32MasterShards) {
  const int n = world()->world_size(), rank = world()->rank();
  at::Tensor master0;
  for (int stage : {0, 1, 2}) {
    Mlp m = Mlp::make(21, at::kBFloat16);
    DataParallelOptimizer opt(m.named(), world(), options(stage));
    train(m, opt, 0, 4, rank, n);
    AdamWShardState s = opt.state_dict();
    EXPECT_EQ(s.master.scalar_type(), at::kFloat);
    // Compute params are the bf16 rounding of the fp32 masters.
    at::Tensor full = stage == 0 ? s.master : read_range(s.layout, [&] {
      std::vector<at::Tensor> v;
      for (auto& st : gather_states(opt)) v.push_back(st.master);
      return v;
    }(), 0, Mlp::kParams);
    EXPECT_TRUE(m.flat().equal(full.to(at::kBFloat16).to(at::kFloat))) << "stage " << stage;
    if (stage == 0)
      master0 = full;
    else
      EXPECT_LT(rel_diff(full, master0), 1e-3) << "stage " << stage;
  }
}

TEST(ZeroMpi, ReshardExactAndResumeOnOneRank) {
  const int n = world()->world_size(), rank = world()->rank();
  for (int stage : {1, 2}) {
    DataParallelOptions o = options(stage);
    Mlp m = Mlp::make(31), ref = Mlp::make(31);
    DataParallelOptimizer opt(m.named(), world(), o);
    RefAdamW r{AdamWHyper{o.beta1, o.beta2, o.eps, o.weight_decay}, o.max_grad_norm};
    train(m, opt, 0, 3, rank, n);
    train_ref(ref, r, 0, 3);
    std::vector<AdamWShardState> saved = gather_states(opt);

    // N -> N+1 -> N is bit exact, and the N+1 shards hold exactly the unpadded vector.
    auto up = reshard_states(saved, n + 1, stage);
    auto back = reshard_states(up, n, stage);
    ASSERT_EQ(static_cast<int>(back.size()), n);
    for (int k = 0; k < n; ++k) {
      EXPECT_TRUE(back[k].master.equal(saved[k].master));
      EXPECT_TRUE(back[k].exp_avg_sq.equal(saved[k].exp_avg_sq));
      EXPECT_EQ(back[k].begin, saved[k].begin);
    }
    std::vector<at::Tensor> ups;
    for (auto& s : up) ups.push_back(s.master);
    EXPECT_TRUE(at::cat(ups).narrow(0, 0, Mlp::kParams).equal(read_range(saved[0].layout, [&] {
      std::vector<at::Tensor> v;
      for (auto& s : saved) v.push_back(s.master);
      return v;
    }(), 0, Mlp::kParams)));

    // N -> 1 (stage 0), loaded into a one-process optimizer that continues on the whole batch.
    AdamWShardState one = reshard_state(saved, 1, 0, 0);
    Mlp local = Mlp::make(999);
    DataParallelOptimizer lopt(local.named(), std::make_shared<LocalComm>(), options(0));
    lopt.load_state_dict(one);
    EXPECT_TRUE(local.flat().equal(m.flat()));
    for (int step = 3; step < 6; ++step) {
      lopt.zero_grad();
      local_backward(local, step, 0, 1, 1);
      lopt.step(2e-2);
    }
    train_ref(ref, r, 3, 6);
    EXPECT_LT(rel_diff(local.flat(), ref.flat()), 1e-6) << "stage " << stage << " world " << n << " -> 1";
  }
}

TEST(ZeroMpi, ResumeFromSmallerWorld) {
  const int n = world()->world_size(), rank = world()->rank();
  if (n < 2) GTEST_SKIP() << "needs 2+ ranks";
  const int m_ranks = n - 1;  // first train on ranks [0, n-1) only
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, rank < m_ranks ? 0 : MPI_UNDEFINED, rank, &sub);
  Mlp model = Mlp::make(41);
  const FlatParamLayout small = FlatParamLayout::from_params(model.named(), m_ranks);
  AdamWShardState mine;
  if (sub != MPI_COMM_NULL) {
    auto sub_comm = std::make_shared<MpiComm>(sub);
    DataParallelOptimizer opt(model.named(), sub_comm, options(1));
    train(model, opt, 0, 3, sub_comm->rank(), m_ranks);
    mine = opt.state_dict();
    sub_comm.reset();
    MPI_Comm_free(&sub);
  }
  // Every rank receives the m_ranks saved shards (as a checkpoint reader would).
  std::vector<AdamWShardState> saved(m_ranks);
  for (int k = 0; k < m_ranks; ++k) {
    saved[k].layout = small;
    saved[k].stage = 1;
    saved[k].rank = k;
    std::tie(saved[k].begin, saved[k].end) = small.shard_range(k);
    for (auto field : {&AdamWShardState::master, &AdamWShardState::exp_avg, &AdamWShardState::exp_avg_sq}) {
      at::Tensor t = k == rank ? (mine.*field).clone() : at::empty({small.shard_size()}, at::kFloat);
      world()->broadcast(t, k);
      saved[k].*field = t;
    }
    saved[k].step = static_cast<int64_t>(world()->all_reduce(k == rank ? double(mine.step) : 0.0, ReduceOp::Sum));
  }
  EXPECT_EQ(saved[0].step, 3);

  // Resume at world n, stage 2, from fresh (different) weights: the loaded masters define the parameters.
  Mlp resumed = Mlp::make(777);
  DataParallelOptimizer opt(resumed.named(), world(), options(2));
  opt.load_state_dict(reshard_state(saved, n, rank, 2));
  train(resumed, opt, 3, 6, rank, n);

  Mlp ref = Mlp::make(41);
  DataParallelOptions o = options(1);
  RefAdamW r{AdamWHyper{o.beta1, o.beta2, o.eps, o.weight_decay}, o.max_grad_norm};
  train_ref(ref, r, 0, 6);
  EXPECT_LT(rel_diff(resumed.flat(), ref.flat()), 1e-6) << m_ranks << " -> " << n;
  EXPECT_EQ(opt.step_count(), 6);
}

// The same ZeRO code on CUDA tensors with the NCCL communicator (one GPU per rank); skipped without enough GPUs.
TEST(ZeroNccl, AllStagesMatchReferenceOnCuda) {
#ifndef GMOD_WITH_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  const int n = world()->world_size(), rank = world()->rank();
  const bool have = at::hasCUDA() && static_cast<int>(c10::cuda::device_count()) >= n;
  if (!all_ranks(have)) GTEST_SKIP() << "needs one CUDA device per rank";
  static std::shared_ptr<Comm> nccl = make_comm(at::Device(at::kCUDA));
  ASSERT_EQ(nccl->backend(), "nccl");
  for (int stage : {0, 1, 2}) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      DataParallelOptions o = options(stage);
      Mlp dp = Mlp::make(11, dtype).to(nccl->device()), ref = Mlp::make(11);
      DataParallelOptimizer opt(dp.named(), nccl, o);
      RefAdamW r{AdamWHyper{o.beta1, o.beta2, o.eps, o.weight_decay}, o.max_grad_norm};
      for (int step = 0; step < 4; ++step) {
        opt.zero_grad();
        zero_grads(ref);
        local_backward(dp, step, rank, n);
        local_backward(ref, step, 0, 1, 1);
        StepResult s = opt.step(2e-2);
        auto [norm, cl] = r.update(ref.tensors(), 2e-2);
        if (dtype == at::kFloat) {
          EXPECT_NEAR(s.grad_norm, norm, 1e-4 * norm);
        }
        EXPECT_FALSE(s.skipped);
      }
      EXPECT_LT(rel_diff(dp.flat(), ref.flat()), dtype == at::kFloat ? 1e-4 : 3e-2) << "stage " << stage;
      EXPECT_EQ(spread_across_ranks(dp.flat()), 0.0) << "ranks disagree, stage " << stage;
      EXPECT_EQ(opt.optimizer_state_bytes(), stage == 0 ? 12 * Mlp::kParams : 12 * ((Mlp::kParams + n - 1) / n));
    }
  }
#endif
}

// Zero3Params (parallel/zero3_params.h) at the launched world size (ctest: 1, 2 and 3 ranks; P = 59 so shards
// are uneven and units straddle shard boundaries): each rank keeps exactly the ZeRO-1/2 shard of the flat
// vector, gather() rebuilds every parameter bitwise, release() frees a unit's memory even while autograd
// holds tensors saved from it (weight.t() of a linear), and a forward/backward that releases each unit after
// its forward and re-gathers it before its backward gives bitwise the gradients of the unsharded model.
#include <gtest/gtest.h>

#include "parallel/data_parallel.h"
#include "parallel/local_comm.h"
#include "parallel/mpi_comm.h"
#include "parallel/zero3_grads.h"
#include "parallel/zero3_optimizer.h"
#include "parallel/zero3_params.h"
#include "parallel/runtime.h"
#include "tests/parallel/parallel_test_util.h"

#include <algorithm>
#include <climits>
#ifdef GMOD_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

using namespace gmod;
using namespace gmod::testing;

// A named namespace around the file keeps its helpers apart from other files in a unity build.
namespace mpi_zero3_test {
namespace {

std::shared_ptr<MpiComm> world() {
  static auto c = std::make_shared<MpiComm>();
  return c;
}

const std::vector<int> kUnits = {0, 0, 1, 1};  // fc1 (w1, b1) = [0, 35), fc2 (w2, b2) = [35, 59)

// The stage-3 backward of two micro-batches on this rank's slice of global batch `step`: both units gathered
// before and released after each, gradients attached per unit (the caller reduces them).
void zero3_backward(Mlp& m, Zero3Params& z, Zero3Grads& g, int step) {
  const int N = world()->world_size(), r = world()->rank();
  auto [x, y] = global_batch(step);
  const int64_t per = kGlobalBatch / N, mb = per / 2;
  for (int i = 0; i < 2; ++i) {
    z.gather(0);
    z.gather(1);
    g.attach(1);
    g.attach(0);
    const int64_t off = r * per + i * mb;
    (m.loss(x.narrow(0, off, mb), y.narrow(0, off, mb)) / 2).backward();
    z.release(1);
    z.release(0);
  }
}

}  // namespace

TEST(Zero3Params, ShardIsTheZero2RangeAndGatherRebuildsBitwise) {
  const Mlp ref = Mlp::make(11);
  Mlp m = Mlp::make(11);
  Zero3Params z(m.named(), kUnits, world());
  const int N = world()->world_size(), r = world()->rank();
  const int64_t S = (Mlp::kParams + N - 1) / N;
  ASSERT_EQ(z.shard().numel(), S);
  const auto [b, e] = z.layout().shard_range(r);
  const int64_t valid = std::max<int64_t>(0, std::min<int64_t>(e, Mlp::kParams) - b);
  EXPECT_TRUE(z.shard().narrow(0, 0, valid).equal(ref.flat().narrow(0, b, valid)));
  EXPECT_EQ(z.shard().narrow(0, valid, S - valid).abs().sum().item<double>(), 0.0) << "padding is zero";
  for (int u = 0; u < z.num_units(); ++u) z.release(u);
  EXPECT_EQ(z.bytes_held(), 4 * S) << "released units hold nothing";
  z.gather(1);
  EXPECT_FALSE(z.gathered(0));
  EXPECT_TRUE(m.w2.equal(ref.w2) && m.b2.equal(ref.b2));
  z.gather(0);
  EXPECT_TRUE(m.flat().equal(ref.flat()));
  EXPECT_EQ(z.bytes_held(), 4 * (S + Mlp::kParams));
  // A changed shard is what the next gather returns, on every rank.
  z.shard().add_(1.0);
  z.release(0);
  z.gather(0);
  EXPECT_TRUE(m.w1.equal(ref.w1 + 1.0) && m.b1.equal(ref.b1 + 1.0)) << "every owner's part moved by +1";
}

TEST(Zero3Params, ReleaseAfterForwardGatherBeforeBackwardGivesTheUnshardedGradients) {
  const Mlp ref = Mlp::make(12);
  auto [x, y] = global_batch(3);
  ref.loss(x, y).backward();

  Mlp m = Mlp::make(12);
  Zero3Params z(m.named(), kUnits, world());
  z.release(0);
  z.release(1);
  const int64_t shard_bytes = z.bytes_held();
  // Forward, unit by unit, each released as soon as it ran.
  z.gather(0);
  at::Tensor h = at::tanh(at::linear(x, m.w1, m.b1));  // autograd saves w1.t(), a view of unit 0's buffer
  z.release(0);
  h.register_hook([&z](const at::Tensor&) { z.gather(0); });  // pre-backward of unit 0
  z.gather(1);
  at::Tensor loss = at::mse_loss(at::linear(h, m.w2, m.b2), y);
  z.release(1);
  EXPECT_EQ(z.bytes_held(), shard_bytes) << "saved tensors must not keep a released unit alive";
  z.gather(1);  // pre-backward of the last unit
  loss.backward();
  EXPECT_TRUE(z.gathered(0));
  for (size_t i = 0; i < 4; ++i)
    EXPECT_TRUE(m.tensors()[i].grad().equal(ref.tensors()[i].grad())) << m.named()[i].first;
  EXPECT_TRUE(m.flat().equal(ref.flat()));
}

TEST(Zero3Params, BadUnitsAreNamed) {
  Mlp m = Mlp::make(13);
  try {
    Zero3Params z(m.named(), {0, 1, 0, 1}, world());
    FAIL() << "units 0, 1, 0 accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("fc2.weight"), std::string::npos) << e.what();
  }
}

// Zero3Grads: two micro-batches (accumulation) with every unit released between them, each unit's gradient
// reduce-scattered once at the end: this rank's fp32 gradient shard is bitwise ZeRO-2's reduced gradient, and
// only the shard stays allocated.
TEST(Zero3Grads, UnitReduceScatterEqualsZero2AndFreesTheBuffers) {
  const int N = world()->world_size(), r = world()->rank();
  Mlp a = Mlp::make(14);
  DataParallelOptions o;
  o.stage = 2;
  o.overlap_comm = false;
  DataParallelOptimizer opt(a.named(), world(), o);
  opt.zero_grad();
  local_backward(a, 0, r, N, 2);
  opt.reduce_gradients();
  const at::Tensor want = opt.reduced_gradient().clone();

  Mlp m = Mlp::make(14);
  Zero3Params z(m.named(), kUnits, world());
  Zero3Grads g(z);
  z.release(0);
  z.release(1);
  zero3_backward(m, z, g, 0);
  EXPECT_EQ(g.bytes_held(), 4 * (z.shard().numel() + Mlp::kParams))
      << "both units' gradients during the window";
  g.reduce(1);
  g.reduce(0);
  EXPECT_FALSE(m.w1.grad().defined());
  EXPECT_EQ(g.bytes_held(), 4 * z.shard().numel()) << "only the fp32 shard after the reduction";
  ASSERT_EQ(g.shard_grad().sizes(), want.sizes());
  EXPECT_TRUE(g.shard_grad().equal(want))
      << "max diff " << (g.shard_grad() - want).abs().max().item<double>();
}

// Zero3Optimizer against DataParallelOptimizer at stage 2, four steps of two accumulated micro-batches with
// global-norm clipping, weight decay and a non-finite gradient on the last rank at step 2 (skipped by every
// rank): after every step the gathered parameters, the step's norm/clip/skip verdict and this rank's
// optimizer state (the checkpointed stage-2 form) are bitwise ZeRO-2's.
static void zero3_matches_zero2(at::ScalarType dtype) {
  const int N = world()->world_size(), r = world()->rank();
  DataParallelOptions o;
  o.stage = 2;
  o.overlap_comm = false;
  o.max_grad_norm = 0.05;
  o.weight_decay = 0.1;
  Mlp a = Mlp::make(15, dtype);
  DataParallelOptimizer z2(a.named(), world(), o);
  Mlp m = Mlp::make(15, dtype);
  Zero3Params z(m.named(), kUnits, world());
  Zero3Grads g(z);
  Zero3Optimizer z3(z, g, AdamWHyper{o.beta1, o.beta2, o.eps, o.weight_decay}, o.max_grad_norm);
  z.release(0);
  z.release(1);
  const int64_t per = kGlobalBatch / N, mb = per / 2;
  int clipped = 0;
  for (int step = 0; step < 4; ++step) {
    auto [x, y] = global_batch(step);
    const double scale = step == 2 && r == N - 1 ? std::nan("") : 1.0;
    z2.zero_grad();
    for (int i = 0; i < 2; ++i) {
      const int64_t off = r * per + i * mb;
      (a.loss(x.narrow(0, off, mb), y.narrow(0, off, mb)) * (scale / 2)).backward();
      z.gather(0);
      z.gather(1);
      g.attach(1);
      g.attach(0);
      (m.loss(x.narrow(0, off, mb), y.narrow(0, off, mb)) * (scale / 2)).backward();
      z.release(1);
      z.release(0);
    }
    g.reduce(1);
    g.reduce(0);
    const StepResult want = z2.step(1e-2), got = z3.step(1e-2);
    EXPECT_EQ(got.skipped, want.skipped) << "step " << step;
    EXPECT_EQ(got.skipped, step == 2) << "step " << step;
    EXPECT_EQ(got.clipped, want.clipped) << "step " << step;
    if (!want.skipped) {
      EXPECT_EQ(got.grad_norm, want.grad_norm) << "step " << step;
    }
    clipped += got.clipped;
    z.gather(0);
    z.gather(1);
    EXPECT_TRUE(m.flat().equal(a.flat())) << "step " << step;
    z.release(0);
    z.release(1);
    const AdamWShardState s2 = z2.state_dict(), s3 = z3.state_dict();
    EXPECT_EQ(s3.step, s2.step);
    EXPECT_EQ(s3.begin, s2.begin);
    EXPECT_TRUE(s3.master.equal(s2.master) && s3.exp_avg.equal(s2.exp_avg) &&
                s3.exp_avg_sq.equal(s2.exp_avg_sq))
        << "step " << step;
  }
  EXPECT_GT(clipped, 0) << "max_grad_norm 0.05 clips";
  EXPECT_EQ(z3.step_count(), 3);
}

TEST(Zero3Optimizer, StepsAreBitwiseZero2WithAccumulationClippingAndSkippedSteps) {
  zero3_matches_zero2(at::kFloat);
}

// bf16 parameters: the local gradients, the per-unit reduce-scatter (MPI sums bf16 in fp32) and the fp32 ->
// bf16 write of the master are the same operations as stage 2's, so bf16 is bitwise too.
TEST(Zero3Optimizer, Bf16StepsAreBitwiseZero2) { zero3_matches_zero2(at::kBFloat16); }

namespace {

// Every rank's stage-2 state, on every rank.
std::vector<AdamWShardState> gather_states(const AdamWShardState& mine) {
  const int n = world()->world_size();
  std::vector<AdamWShardState> all(static_cast<size_t>(n));
  for (auto field : {&AdamWShardState::master, &AdamWShardState::exp_avg, &AdamWShardState::exp_avg_sq}) {
    at::Tensor buf = at::empty({n * (mine.*field).numel()}, at::kFloat);
    world()->all_gather(mine.*field, buf);
    for (int r = 0; r < n; ++r) all[size_t(r)].*field = buf.view({n, -1})[r].clone();
  }
  for (int r = 0; r < n; ++r) {
    all[size_t(r)].layout = mine.layout;
    all[size_t(r)].stage = mine.stage;
    all[size_t(r)].rank = r;
    std::tie(all[size_t(r)].begin, all[size_t(r)].end) = mine.layout.shard_range(r);
    all[size_t(r)].step = mine.step;
  }
  return all;
}

// One stage-3 step of two micro-batches on this rank's slice of global batch `step`.
void zero3_step(Mlp& m, Zero3Params& z, Zero3Grads& g, Zero3Optimizer& opt, int step) {
  zero3_backward(m, z, g, step);
  g.reduce(1);
  g.reduce(0);
  opt.step(1e-2);
}

}  // namespace

// Checkpoints move between stage 3 and stages 1/2 across world sizes: a stage-3 run's state, resharded to one
// rank at stage 1, loads into a one-process ZeRO-1 optimizer with bitwise the same parameters; a ZeRO-1 run's
// state, resharded to this world at stage 2, loads into Zero3Optimizer and into a ZeRO-2 optimizer, which
// then train on bitwise equal.
TEST(Zero3Optimizer, CheckpointsMoveBetweenStage3AndStages1And2) {
  const int N = world()->world_size(), r = world()->rank();
  AdamWHyper hyper;
  hyper.weight_decay = 0.1;
  {
    Mlp m = Mlp::make(16);
    Zero3Params z(m.named(), kUnits, world());
    Zero3Grads g(z);
    Zero3Optimizer opt(z, g, hyper, 0.05);
    for (int step = 0; step < 2; ++step) zero3_step(m, z, g, opt, step);
    const std::vector<AdamWShardState> saved = gather_states(opt.state_dict());
    Mlp local = Mlp::make(998);
    DataParallelOptions o1;
    o1.stage = 1;
    DataParallelOptimizer lopt(local.named(), std::make_shared<LocalComm>(), o1);
    lopt.load_state_dict(reshard_state(saved, 1, 0, 1));
    z.gather(0);
    z.gather(1);
    EXPECT_TRUE(local.flat().equal(m.flat())) << "stage 3 at world " << N << " -> stage 1 at world 1";
    EXPECT_EQ(lopt.step_count(), 2);
  }
  {
    DataParallelOptions o1;
    o1.stage = 1;
    o1.weight_decay = 0.1;
    o1.max_grad_norm = 0.05;
    Mlp a = Mlp::make(17);
    DataParallelOptimizer z1(a.named(), world(), o1);
    for (int step = 0; step < 2; ++step) {
      z1.zero_grad();
      local_backward(a, step, r, N, 2);
      z1.step(1e-2);
    }
    const AdamWShardState mine = reshard_state(gather_states(z1.state_dict()), N, r, 2);
    Mlp b = Mlp::make(996), m = Mlp::make(997);
    DataParallelOptions o2 = o1;
    o2.stage = 2;
    o2.overlap_comm = false;
    DataParallelOptimizer z2(b.named(), world(), o2);
    z2.load_state_dict(mine);
    Zero3Params z(m.named(), kUnits, world());
    Zero3Grads g(z);
    Zero3Optimizer z3(z, g, hyper, 0.05);
    z3.load_state_dict(mine);
    z.release(0);
    z.release(1);
    z.gather(0);
    z.gather(1);
    EXPECT_TRUE(m.flat().equal(a.flat())) << "stage 1 -> stage 3 at world " << N;
    z.release(0);
    z.release(1);
    for (int step = 2; step < 4; ++step) {
      z2.zero_grad();
      local_backward(b, step, r, N, 2);
      z2.step(1e-2);
      zero3_step(m, z, g, z3, step);
    }
    z.gather(0);
    z.gather(1);
    EXPECT_TRUE(m.flat().equal(b.flat())) << "resumed stage 3 trains as resumed stage 2";
    EXPECT_EQ(z3.step_count(), 4);
  }
}

// Comm::all_gather_v_start (MPI_Iallgatherv in place) with uneven and empty blocks: every rank's block arrives
// bitwise, several gathers in flight at once complete in any wait order, and a block above the per-call limit
// goes through the blocking chunked path with the same result.
TEST(Zero3Params, NonBlockingUnevenAllGather) {
  const int N = world()->world_size(), r = world()->rank();
  for (const int64_t limit : {int64_t(INT_MAX), int64_t(3)}) {
    auto comm = std::dynamic_pointer_cast<MpiComm>(world()->duplicate());
    ASSERT_TRUE(comm);
    comm->set_max_count(limit);
    std::vector<at::Tensor> bufs, want;
    std::vector<std::unique_ptr<CommRequest>> reqs;
    for (int g = 0; g < 3; ++g) {
      std::vector<int64_t> counts(static_cast<size_t>(N));
      for (int k = 0; k < N; ++k) counts[size_t(k)] = (k + g) % 3 == 1 ? 0 : 1 + 2 * k + g;  // some empty
      int64_t total = 0, off = 0;
      for (int64_t c : counts) total += c;
      at::Tensor ref = at::arange(total, at::kFloat) * (g + 1) + 0.25;
      at::Tensor buf = at::full({total}, -1.0f);
      for (int k = 0; k < r; ++k) off += counts[size_t(k)];
      buf.narrow(0, off, counts[size_t(r)]).copy_(ref.narrow(0, off, counts[size_t(r)]));
      reqs.push_back(comm->all_gather_v_start(buf, counts));
      bufs.push_back(buf);
      want.push_back(ref);
    }
    for (int g = 2; g >= 0; --g) {  // waited in the reverse of the start order
      reqs[size_t(g)]->wait();
      EXPECT_TRUE(bufs[size_t(g)].equal(want[size_t(g)])) << "gather " << g << ", limit " << limit;
    }
  }
  EXPECT_THROW(world()->all_gather_v_start(at::zeros({4}), std::vector<int64_t>(size_t(N) + 1, 0)),
               std::runtime_error);
}

// Prefetch as Zero3Driver does it: both units' gathers started before either is waited for, the forward run
// with the second still in flight; the parameters and gradients are bitwise those of blocking gathers.
TEST(Zero3Params, StartedGathersEqualBlockingOnes) {
  const int N = world()->world_size(), r = world()->rank();
  Mlp a = Mlp::make(16), m = Mlp::make(16);
  Zero3Params za(a.named(), kUnits, world()), zm(m.named(), kUnits, world());
  for (Zero3Params* z : {&za, &zm}) z->release(0), z->release(1);
  auto [x, y] = global_batch(1);
  const int64_t per = kGlobalBatch / N;
  za.gather(0);
  za.gather(1);
  a.loss(x.narrow(0, r * per, per), y.narrow(0, r * per, per)).backward();
  zm.gather_start(0);
  zm.gather_start(1);
  EXPECT_TRUE(zm.gathered(0) && zm.gathered(1));
  zm.wait(0);
  zm.progress();
  zm.wait(1);
  EXPECT_FALSE(zm.in_flight(0) || zm.in_flight(1));
  m.loss(x.narrow(0, r * per, per), y.narrow(0, r * per, per)).backward();
  EXPECT_TRUE(m.flat().equal(a.flat()));
  EXPECT_TRUE(m.w1.grad().equal(a.w1.grad()) && m.w2.grad().equal(a.w2.grad()));
  zm.gather_start(0);
  zm.release(0);  // a started gather is completed before its storage goes
  EXPECT_FALSE(zm.gathered(0) || zm.in_flight(0));
}

// The same building blocks on CUDA with NCCL (gathers on the communicator's gather stream, reductions on
// Zero3Grads' reduction stream with the unit's gradient recordStream'ed and dropped at once): bitwise the MPI
// result. Skipped without one CUDA device per rank.
TEST(Zero3Nccl, GathersAndReductionsOnSideStreamsEqualMpi) {
#ifndef GMOD_WITH_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  const int N = world()->world_size(), r = world()->rank();
  const bool have = at::hasCUDA() && static_cast<int>(c10::cuda::device_count()) >= N;
  if (world()->all_reduce(have ? 0.0 : 1.0, ReduceOp::Max) != 0.0) GTEST_SKIP() << "needs one CUDA device per rank";
  static std::shared_ptr<Comm> nccl = make_comm(at::Device(at::kCUDA));
  ASSERT_EQ(nccl->backend(), "nccl");
  Mlp a = Mlp::make(17), m = Mlp::make(17).to(nccl->device());
  Zero3Params za(a.named(), kUnits, world()), zm(m.named(), kUnits, nccl);
  Zero3Grads ga(za), gm(zm);
  for (Zero3Params* z : {&za, &zm}) z->release(0), z->release(1);
  zero3_backward(a, za, ga, 2);
  auto [x, y] = global_batch(2);
  const int64_t per = kGlobalBatch / N, mb = per / 2;
  for (int i = 0; i < 2; ++i) {
    zm.gather_start(0);
    zm.gather_start(1);
    zm.wait(0);
    zm.wait(1);
    gm.attach(1);
    gm.attach(0);
    const int64_t off = r * per + i * mb;
    at::Tensor xd = x.narrow(0, off, mb).to(nccl->device()), yd = y.narrow(0, off, mb).to(nccl->device());
    (m.loss(xd, yd) / 2).backward();
    zm.release(1);
    zm.release(0);
  }
  ga.reduce(1), ga.reduce(0);
  gm.reduce_start(1);
  gm.reduce_start(0);
  EXPECT_FALSE(m.w1.grad().defined()) << "the unit's gradient is dropped when its reduction is enqueued";
  gm.finish();
  // CUDA against CPU is a comparison of two arithmetics (SLEEF's tanh against CUDA's tanhf, other GEMM summation
  // orders), never bitwise: fp32, 1e-5 of the gradient's largest magnitude.
  const at::Tensor got = gm.shard_grad().cpu(), want = ga.shard_grad();
  const double scale = std::max(want.abs().max().item<double>(), 1e-30);
  EXPECT_LE((got - want).abs().max().item<double>() / scale, 1e-5)
      << "max diff " << (got - want).abs().max().item<double>() << " of " << scale;
  // Bitwise only CUDA against CUDA: at one rank the reduced shard is the plain autograd gradient of the same model
  // on the same GPU, same micro-batches, same order.
  if (N == 1) {
    Mlp p = Mlp::make(17).to(nccl->device());
    for (int i = 0; i < 2; ++i) {
      const int64_t mb = kGlobalBatch / 2;
      at::Tensor xd = x.narrow(0, i * mb, mb).to(nccl->device()), yd = y.narrow(0, i * mb, mb).to(nccl->device());
      (p.loss(xd, yd) / 2).backward();
    }
    std::vector<at::Tensor> g;
    for (const auto& t : p.tensors()) g.push_back(t.grad().reshape({-1}).cpu());
    const at::Tensor plain = at::cat(g);
    EXPECT_TRUE(got.narrow(0, 0, plain.numel()).equal(plain))
        << "stage 3 on NCCL vs plain CUDA autograd, max diff " << (got.narrow(0, 0, plain.numel()) - plain).abs().max().item<double>();
  }
#endif
}

}  // namespace mpi_zero3_test

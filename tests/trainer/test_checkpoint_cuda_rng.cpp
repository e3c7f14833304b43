// The CUDA generator state in the optimizer files (/cuda_rng_state): saved when given and read back byte-exact, and on
// a GPU the restored generator continues the same sequence; CPU runs (and checkpoints written before the field
// existed) have no such dataset and read it as empty.
#include "tests/common/paths.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/hdf5_file.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <cstring>

namespace {

using gmod::test::TempDir;

gmod::CheckpointContent content(int64_t step) {
  gmod::CheckpointContent c;
  c.step = step;
  c.model = {{"w", at::arange(6, at::kFloat)}};
  c.shard_layout = {{"total", 6}};
  return c;
}

gmod::RankState rank_state() {
  gmod::RankState s;
  s.tensors = {{"master", at::arange(6, at::kFloat)}};
  s.rng_state = gmod::generator_state_bytes(at::make_generator<at::CPUGeneratorImpl>(5));
  return s;
}

std::string optim_file(const std::string& step_dir) { return step_dir + "/optim-rank-0.h5"; }

}  // namespace

TEST(CheckpointCudaRng, SavedAndReadBackByteExact) {
  TempDir run;
  gmod::RankState rs = rank_state();
  const bool gpu = at::hasCUDA();
  at::Tensor expect;
  if (gpu) {
    at::Generator g = at::globalContext().defaultGenerator(at::Device(at::kCUDA, 0));
    (void)at::randn({100}, at::TensorOptions().device(at::kCUDA));  // advance the device generator
    rs.cuda_rng_state = gmod::generator_state_bytes(g);
    expect = at::randn({1000}, at::TensorOptions().device(at::kCUDA)).cpu();
  } else {
    // The CUDA generator's state layout (seed, philox offset: two uint64), as bytes.
    const uint64_t seed_offset[2] = {0x1234567890abcdefull, 4096};
    rs.cuda_rng_state.resize(sizeof seed_offset);
    std::memcpy(rs.cuda_rng_state.data(), seed_offset, sizeof seed_offset);
  }
  const std::string dir = gmod::CheckpointWriter(run.str(), 0, 1, {}).save(content(3), rs);
  ASSERT_EQ(gmod::CheckpointManager::verify(dir), "");
  gmod::RankState back = gmod::CheckpointReader(dir).read_rank_state(0);
  EXPECT_EQ(back.cuda_rng_state, rs.cuda_rng_state);
  EXPECT_EQ(back.rng_state, rs.rng_state);
  if (gpu) {
    gmod::set_generator_state_bytes(at::globalContext().defaultGenerator(at::Device(at::kCUDA, 0)),
                                    back.cuda_rng_state);
    at::Tensor again = at::randn({1000}, at::TensorOptions().device(at::kCUDA)).cpu();
    EXPECT_TRUE(at::equal(again, expect));
  }
}

TEST(CheckpointCudaRng, AbsentForCpuRunsAndReadsAsEmpty) {
  TempDir run;
  const std::string dir = gmod::CheckpointWriter(run.str(), 0, 1, {}).save(content(2), rank_state());
  EXPECT_FALSE(gmod::H5File::open(optim_file(dir)).exists("cuda_rng_state"));
  gmod::RankState back = gmod::CheckpointReader(dir).read_rank_state(0);
  EXPECT_TRUE(back.cuda_rng_state.empty());
  EXPECT_FALSE(back.rng_state.empty());
}

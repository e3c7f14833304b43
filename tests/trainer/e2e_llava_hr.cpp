// The tiny LLaVA-HR run of CI (configs/tiny_llava_hr.json: a multipath tower composed from committed tiny
// parts, towers trained with their stitch adapters, activation checkpointing down to the tower units, ZeRO-2,
// overlapped reduction) resumes bitwise on 2 ranks, dense and γ-MoD: N steps straight equal k steps, stop,
// save, resume to N, in every parameter (towers and adapters included), the optimizer state and the per-step
// losses (issue 17 item 6).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "model/safetensors.h"
#include "tests/common/paths.h"
#include "tests/trainer/e2e_util.h"

namespace {

using json = nlohmann::json;
using namespace gmod::test;
using namespace gmod::e2e;

// `gmod train` on configs/tiny_llava_hr.json under mpirun at `np` ranks, from the source dir (the config
// names its parts relative to it), data and run dir under the test's temporary dir. Output appends to
// <run_dir>.log.
int tiny_hr(int np, const std::string& data_dir, const std::string& run_dir,
            const std::vector<std::string>& sets) {
  std::string cmd = "cd " + source_dir() + " && " + GMOD_MPIEXEC + " " + GMOD_MPIEXEC_NP + " " +
                    std::to_string(np) + " " + GMOD_MPIRUN_FLAGS + " " + GMOD_BIN +
                    " train --threads 1 --config configs/tiny_llava_hr.json --set data.train=" + data_dir +
                    "/train.json --set run_dir=" + run_dir + " --set resume=auto";
  for (const auto& s : sets) cmd += " --set '" + s + "'";
  return run_shell(cmd + " >> " + run_dir + ".log 2>&1");
}

// 4 steps straight == 2 steps, stop (schedule.exit_at_step: the same run setup), resume, 2 more; `sets`
// configure both runs. Also checks that the towers and the stitches trained (they left their initial values).
void expect_tiny_hr_resumes_bitwise(const std::vector<std::string>& sets, bool mod) {
  TempDir t;
  const std::string data = t.str("data"), u = t.str("uninterrupted"), s = t.str("stopped");
  std::vector<std::string> all{"schedule.max_steps=4", "checkpoint.every=2"};
  all.insert(all.end(), sets.begin(), sets.end());
  std::vector<std::string> stop = all;
  stop.push_back("schedule.exit_at_step=2");
  ASSERT_EQ(tiny_hr(2, data, u, all), 0) << slurp(u + ".log");
  ASSERT_EQ(tiny_hr(2, data, s, stop), 0) << slurp(s + ".log");
  ASSERT_TRUE(std::filesystem::exists(ckpt(s, 2)));
  ASSERT_FALSE(std::filesystem::exists(ckpt(s, 4)));
  ASSERT_EQ(tiny_hr(2, data, s, all), 0) << slurp(s + ".log");
  const std::string log = slurp(s + ".log");
  EXPECT_NE(log.find("resume: " + ckpt(s, 2)), std::string::npos) << log;
  EXPECT_NE(log.find("vision_slow="), std::string::npos) << log;
  EXPECT_EQ(log.find("MoD layers") != std::string::npos, mod) << log;

  std::vector<int64_t> order;
  auto mu = step_metrics(u), ms = step_metrics(s, &order);
  EXPECT_EQ(order, (std::vector<int64_t>{1, 2, 3, 4}));
  ASSERT_EQ(mu.size(), 4u);
  for (int64_t k = 1; k <= 4; ++k)
    for (const char* f : {"loss", "lm_loss", "grad_norm", "lr", "tokens"})
      EXPECT_EQ(mu[k][f].dump(), ms[k][f].dump()) << "step " << k << " " << f;
  EXPECT_EQ(mu[1].contains("skip_ratio"), mod);
  if (mod) {
    for (int64_t k = 1; k <= 4; ++k)
      for (const char* f : {"routing_loss", "skip_ratio"})
        EXPECT_EQ(mu[k][f].dump(), ms[k][f].dump()) << "step " << k << " " << f;
  }
  expect_same_model(ckpt(u, 4), ckpt(s, 4));
  for (const char* n : {"master", "exp_avg", "exp_avg_sq"})
    EXPECT_TRUE(bit_equal(flat_optimizer(ckpt(u, 4), n), flat_optimizer(ckpt(s, 4), n))) << n;

  // Towers trained: the ConvNeXt stem and a CLIP layer moved away from the parts, the zero-initialised stitch
  // projection became non-zero.
  gmod::CheckpointReader reader(ckpt(s, 4));
  const std::string parts = source_dir() + "/tests/fixtures/llava_hr/parts";
  gmod::SafetensorsCheckpoint convnext(parts + "/convnext"), clip(parts + "/clip");
  EXPECT_FALSE(bit_equal(reader.read_model_tensor("vision.slow_vision_tower.stem.0.weight"),
                         convnext.tensor("stem.0.weight")));
  EXPECT_FALSE(bit_equal(
      reader.read_model_tensor("vision.fast_vision_tower.vision_model.encoder.layers.1.mlp.fc1.weight"),
      clip.tensor("vision_model.encoder.layers.1.mlp.fc1.weight")));
  EXPECT_GT(
      reader.read_model_tensor("vision.align_stages_latent.0.slow_proj.weight").abs().max().item<double>(),
      0.0);
}

// The config as written: ARank, then arank_mod conversion (layer 3 routed at 0.5), the γ-MoD routing loss.
TEST(TrainLlavaHrE2E, TinyLlavaHrGammaModResumesBitwise) { expect_tiny_hr_resumes_bitwise({}, true); }

// The same model dense (no ARank phase, no MoD layer).
TEST(TrainLlavaHrE2E, TinyLlavaHrDenseResumesBitwise) {
  expect_tiny_hr_resumes_bitwise({"mod.enabled=false"}, false);
}

// Packed (data.pack_to, two samples of up to 640 tokens per micro-batch in rows of 1280) against unpacked, γ-MoD,
// towers trained, every unit checkpointed: the same per-step losses and final weights within fp32 rounding.
TEST(TrainLlavaHrE2E, TinyLlavaHrGammaModPackedTrainsLikeUnpacked) {
  TempDir t;
  const std::string data = t.str("data"), u = t.str("unpacked"), p = t.str("packed");
  const std::vector<std::string> sets{"schedule.max_steps=3", "batch.micro_batch=2", "checkpoint.every=3"};
  std::vector<std::string> packed = sets;
  packed.push_back("data.pack_to=1280");
  ASSERT_EQ(tiny_hr(2, data, u, sets), 0) << slurp(u + ".log");
  ASSERT_EQ(tiny_hr(2, data, p, packed), 0) << slurp(p + ".log");
  auto mu = step_metrics(u), mp = step_metrics(p);
  ASSERT_EQ(mu.size(), 3u);
  ASSERT_EQ(mp.size(), 3u);
  for (int64_t k = 1; k <= 3; ++k) {
    EXPECT_EQ(mu[k]["tokens"], mp[k]["tokens"]) << "step " << k;
    EXPECT_EQ(mu[k]["skip_ratio"].dump(), mp[k]["skip_ratio"].dump()) << "step " << k;
    for (const char* f : {"lm_loss", "routing_loss", "grad_norm"})
      EXPECT_LT(std::abs(mp[k][f].get<double>() - mu[k][f].get<double>()) / std::abs(mu[k][f].get<double>()), 1e-5)
          << "step " << k << " " << f;
  }
  auto mw = gmod::CheckpointReader(ckpt(u, 3)).read_model(), pw = gmod::CheckpointReader(ckpt(p, 3)).read_model();
  ASSERT_EQ(mw.size(), pw.size());
  double worst = 0;
  for (size_t i = 0; i < mw.size(); ++i) {
    const double scale = std::max(mw[i].second.abs().max().item<double>(), 1e-30);
    worst = std::max(worst, (mw[i].second - pw[i].second).abs().max().item<double>() / scale);
  }
  EXPECT_LT(worst, 1e-4);
}

}  // namespace

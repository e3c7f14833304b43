// Sequence packing end to end (`gmod train` with data.pack_to on the demo dataset and model, 2 ranks, γ-MoD on the
// ARank-chosen layers): packed training follows the unpacked run step by step (same samples per micro-batch, per-step
// losses and the final weights within fp32 rounding, no compute on padding) at ZeRO-3 with every layer checkpointed,
// and a packed run stopped and resumed ends bitwise where the uninterrupted packed run ends.
#include "trainer/checkpoint/checkpoint.h"

#include "tests/common/paths.h"
#include "tests/trainer/e2e_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

namespace {

using json = nlohmann::json;
using gmod::test::TempDir;
using gmod::e2e::bit_equal;
using gmod::e2e::ckpt;
using gmod::e2e::expect_same_model;
using gmod::e2e::gmod_train;
using gmod::e2e::slurp;
using gmod::e2e::step_metrics;

// Micro-batches of 4 samples of at most 128 tokens: packed into rows of 256.
std::string write_config(const std::string& run_dir, const json& extra = json::object()) {
  json e{{"freeze", {{"vision", false}}},
         {"parallel", {{"timeout_s", 600.0}}},
         {"batch", {{"micro_batch", 4}, {"global_batch", 16}}},
         {"schedule", {{"max_steps", 4}}},
         {"metrics", {{"log_sample_ids", true}}}};
  e.merge_patch(extra);
  return gmod::e2e::write_config(run_dir, e);
}

// "step micro id id ..." lines of a samples log -> (step, micro) -> the ids as a set.
std::map<std::pair<int64_t, int64_t>, std::multiset<int64_t>> micro_batches(const std::string& path) {
  std::map<std::pair<int64_t, int64_t>, std::multiset<int64_t>> out;
  std::istringstream in(slurp(path));
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    int64_t step, micro, id;
    ls >> step >> micro;
    auto& ids = out[{step, micro}];
    while (ls >> id) ids.insert(id);
  }
  return out;
}

double rel(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

}  // namespace

TEST(PackE2E, PackedTrainsLikeUnpackedZero3Checkpointed) {
  TempDir t;
  const std::string u = t.str("unpacked"), p = t.str("packed");
  const std::vector<std::string> common{"optimizer.zero_stage=3", "model.activation_checkpointing=full"};
  std::vector<std::string> packed = common;
  packed.push_back("data.pack_to=256");
  ASSERT_EQ(gmod_train(2, write_config(u), common), 0) << slurp(u + ".config.json.log");
  ASSERT_EQ(gmod_train(2, write_config(p), packed), 0) << slurp(p + ".config.json.log");
  for (int r = 0; r < 2; ++r)  // the same samples in the same micro-batches (packed: in row order)
    EXPECT_EQ(micro_batches(u + "/samples/rank-" + std::to_string(r) + ".txt"),
              micro_batches(p + "/samples/rank-" + std::to_string(r) + ".txt"))
        << "rank " << r;
  auto mu = step_metrics(u), mp = step_metrics(p);
  ASSERT_EQ(mu.size(), 4u);
  ASSERT_EQ(mp.size(), 4u);
  int64_t padded_u = 0, padded_p = 0, real = 0;
  for (int64_t k = 1; k <= 4; ++k) {
    EXPECT_EQ(mu[k]["tokens"], mp[k]["tokens"]) << "step " << k;
    for (const char* f : {"lm_loss", "routing_loss", "grad_norm"})
      EXPECT_LT(rel(mp[k][f].get<double>(), mu[k][f].get<double>()), 1e-5) << "step " << k << " " << f;
    EXPECT_EQ(mu[k]["skip_ratio"].dump(), mp[k]["skip_ratio"].dump()) << "step " << k << ": per-sample capacities";
    padded_u += mu[k]["padded_tokens"].get<int64_t>();
    padded_p += mp[k]["padded_tokens"].get<int64_t>();
    real += mu[k]["tokens"].get<int64_t>();
  }
  EXPECT_LT(padded_p, padded_u) << "packing did not reduce the positions computed";
  std::cout << "positions computed: unpacked " << padded_u << ", packed " << padded_p << ", real tokens " << real
            << "\n";
  auto mw = gmod::CheckpointReader(ckpt(u, 4)).read_model(), pw = gmod::CheckpointReader(ckpt(p, 4)).read_model();
  ASSERT_EQ(mw.size(), pw.size());
  double worst = 0;
  std::string worst_name;
  for (size_t i = 0; i < mw.size(); ++i) {
    ASSERT_EQ(mw[i].first, pw[i].first);
    // Floored at 1e-3: a tensor whose gradient is analytically zero (CLIP's key bias: softmax ignores a constant per
    // query row) stays at ~1e-8, rounding noise that no relative comparison can hold.
    const double scale = std::max(mw[i].second.abs().max().item<double>(), 1e-3);
    const double d = (mw[i].second - pw[i].second).abs().max().item<double>() / scale;
    if (d > worst) worst = d, worst_name = mw[i].first;
  }
  std::cout << "final weights: largest relative difference " << worst << " (" << worst_name << ")\n";
  EXPECT_LT(worst, 1e-4);  // four AdamW steps at lr 2e-3 from gradients equal within fp32 rounding
}

TEST(PackE2E, PackedExactResumeTwoRanks) {
  TempDir t;
  const std::string u = t.str("uninterrupted"), s = t.str("stopped");
  const std::vector<std::string> sets{"data.pack_to=256"};
  std::vector<std::string> stop = sets;
  stop.push_back("schedule.exit_at_step=2");
  ASSERT_EQ(gmod_train(2, write_config(u), sets), 0) << slurp(u + ".config.json.log");
  ASSERT_EQ(gmod_train(2, write_config(s), stop), 0) << slurp(s + ".config.json.log");
  ASSERT_TRUE(std::filesystem::exists(ckpt(s, 2)));
  ASSERT_EQ(gmod_train(2, write_config(s), sets), 0) << slurp(s + ".config.json.log");
  EXPECT_NE(slurp(s + ".config.json.log").find("resume: " + ckpt(s, 2)), std::string::npos);
  auto mu = step_metrics(u), ms = step_metrics(s);
  ASSERT_EQ(mu.size(), 4u);
  for (int64_t k = 1; k <= 4; ++k)
    for (const char* f : {"loss", "lm_loss", "routing_loss", "grad_norm", "tokens", "padded_tokens"})
      EXPECT_EQ(mu[k][f].dump(), ms[k][f].dump()) << "step " << k << " " << f;
  expect_same_model(ckpt(u, 4), ckpt(s, 4));
}

TEST(PackE2E, PackToBelowMaxLenIsANamedError) {
  TempDir t;
  const std::string u = t.str("bad");
  EXPECT_NE(gmod_train(0, write_config(u), {"data.pack_to=100"}), 0);
  EXPECT_NE(slurp(u + ".config.json.log").find("data.pack_to: 100"), std::string::npos)
      << slurp(u + ".config.json.log");
}

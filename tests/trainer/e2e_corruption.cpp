// End-to-end `gmod train` runs against corrupt checkpoints (the demo dataset and tiny demo model, as e2e_train.cpp):
// a corrupt newest checkpoint is passed over, a corrupt tensor found while loading is passed over by every rank, and
// checkpoints that all fail verification are never trained over. Each test is its own ctest entry (CMakeLists.txt).
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/hdf5_file.h"

#include "tests/common/paths.h"
#include "tests/trainer/e2e_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

using json = nlohmann::json;
using gmod::test::TempDir;

using gmod::e2e::ckpt;
using gmod::e2e::gmod_train;
using gmod::e2e::slurp;
using gmod::e2e::step_metrics;

// The shared e2e config (tests/trainer/e2e_util.h) with the trained vision tower and the default collective deadline
// of these runs, as in e2e_train.cpp.
std::string write_config(const std::string& run_dir, const json& extra = json::object()) {
  json e{{"freeze", {{"vision", false}}}, {"parallel", {{"timeout_s", 600.0}}}};
  e.merge_patch(extra);
  return gmod::e2e::write_config(run_dir, e);
}

}  // namespace

// The newest checkpoint is corrupt: `resume auto` reports it, passes over it and resumes from the one before, and
// the redone step reproduces the original loss bit for bit.
TEST(TrainE2E, CorruptNewestCheckpointIsPassedOver) {
  TempDir t;
  const std::string run = t.str("corrupt");
  const std::string cfg = write_config(run, {{"checkpoint", {{"every", 1}, {"keep_last", 3}}}});
  ASSERT_EQ(gmod_train(0, cfg, {"schedule.exit_at_step=3"}), 0) << slurp(cfg + ".log");
  const auto first = step_metrics(run);
  ASSERT_EQ(first.size(), 3u);
  const std::string victim = ckpt(run, 3) + "/model.h5";
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const auto size = int64_t(f.tellg());
    f.seekp(size / 2);
    char c = 0;
    f.seekg(size / 2);
    f.get(c);
    f.seekp(size / 2);
    f.put(char(c ^ 0x5a));
  }
  ASSERT_EQ(gmod_train(0, cfg, {"schedule.exit_at_step=4"}), 0) << slurp(cfg + ".log");
  const std::string log = slurp(cfg + ".log");
  EXPECT_NE(log.find("resume: " + ckpt(run, 2)), std::string::npos) << log;
  EXPECT_NE(log.find("step-3"), std::string::npos) << log;  // the warning names the broken one
  std::vector<int64_t> order;
  auto after = step_metrics(run, &order);
  EXPECT_EQ(order, (std::vector<int64_t>{1, 2, 3, 3, 4}));
  EXPECT_EQ(after[3]["loss"].dump(), first.at(3)["loss"].dump());
  EXPECT_EQ(gmod::CheckpointManager::verify(ckpt(run, 4)), "");
  EXPECT_EQ(gmod::CheckpointManager::verify(ckpt(run, 3)), "");  // re-saved
  // The corrupt one is kept, out of the way, never deleted.
  EXPECT_TRUE(std::filesystem::exists(ckpt(run, 3) + ".corrupt/model.h5")) << log;
  EXPECT_NE(log.find("kept as " + ckpt(run, 3) + ".corrupt"), std::string::npos) << log;
}

// A resume reads the weights once: the check before loading takes the large datasets at their stored CRCs, and each
// is checked as it is read. A byte flipped inside rank 1's optimizer state (which only rank 1 reads) passes the check
// before loading; rank 1 finds it while reading, every rank agrees, and the job resumes from the older checkpoint
// as if the check had caught it, bitwise, keeping the corrupt one. With resume=<that dir>, the error names it.
TEST(TrainE2E, CorruptTensorFoundWhileLoadingIsPassedOver) {
  TempDir t;
  const std::string run = t.str("corrupt_on_load");
  const std::string cfg = write_config(run, {{"checkpoint", {{"every", 1}, {"keep_last", 3}}}});
  ASSERT_EQ(gmod_train(2, cfg, {"schedule.exit_at_step=3"}), 0) << slurp(cfg + ".log");
  const auto first = step_metrics(run);
  ASSERT_EQ(first.size(), 3u);
  const std::string victim = ckpt(run, 3) + "/optim-rank-1.h5";
  std::vector<gmod::KnownCrcRegion> large;
  {
    const gmod::H5File f = gmod::H5File::open(victim);
    large = f.checksummed_regions(gmod::CheckpointReader::kDeferredCrcBytes);
  }
  ASSERT_FALSE(large.empty()) << victim << " has no dataset of 64 KiB or more: the test model is too small";
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = std::streamoff(large[0].offset + large[0].bytes / 2);
    char c = 0;
    f.seekg(at);
    f.get(c);
    f.seekp(at);
    f.put(char(c ^ 0x5a));
  }
  // The check before loading passes it (metadata and small datasets only); the full-file CRC does not.
  EXPECT_EQ(gmod::CheckpointManager::verify_file_deferring_data(ckpt(run, 3), "optim-rank-1.h5"), "");
  EXPECT_NE(gmod::CheckpointManager::verify_file(ckpt(run, 3), "optim-rank-1.h5"), "");

  const std::string explicit_cfg = write_config(run + "_explicit", {{"resume", ckpt(run, 3)}});
  EXPECT_NE(gmod_train(2, explicit_cfg, {"schedule.exit_at_step=4"}), 0);
  const std::string elog = slurp(explicit_cfg + ".log");
  EXPECT_NE(elog.find("resume: checkpoint " + ckpt(run, 3) + " is not valid"), std::string::npos) << elog;
  EXPECT_NE(elog.find("checksum mismatch for dataset"), std::string::npos) << elog;

  ASSERT_EQ(gmod_train(2, cfg, {"schedule.exit_at_step=4"}), 0) << slurp(cfg + ".log");
  const std::string log = slurp(cfg + ".log");
  EXPECT_NE(log.find("checksum mismatch for dataset"), std::string::npos) << log;  // rank 1 names the tensor
  EXPECT_NE(log.find("(while loading)"), std::string::npos) << log;
  EXPECT_NE(log.find("resume: " + ckpt(run, 2)), std::string::npos) << log;
  std::vector<int64_t> order;
  auto after = step_metrics(run, &order);
  EXPECT_EQ(order, (std::vector<int64_t>{1, 2, 3, 3, 4}));
  EXPECT_EQ(after[3]["loss"].dump(), first.at(3)["loss"].dump());
  EXPECT_TRUE(std::filesystem::exists(ckpt(run, 3) + ".corrupt/optim-rank-1.h5")) << log;
  EXPECT_EQ(gmod::CheckpointManager::verify(ckpt(run, 3)), "");  // re-saved
}

// `resume: auto` with checkpoints that all fail verification refuses to start and touches nothing;
// `auto_or_scratch` starts from scratch and keeps them as step-N.corrupt. A torn metrics line (a crash mid-write)
// is repaired when the run starts again.
TEST(TrainE2E, AllCorruptCheckpointsAreNeverTrainedOver) {
  TempDir t;
  const std::string run = t.str("run");
  const std::string cfg = write_config(run, {{"checkpoint", {{"every", 1}, {"keep_last", 2}}}});
  ASSERT_EQ(gmod_train(0, cfg, {"schedule.exit_at_step=2"}), 0) << slurp(cfg + ".log");
  for (int64_t s : {1, 2}) {
    const std::string m = ckpt(run, s) + "/model.h5";
    std::fstream f(m, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(std::filesystem::file_size(m) / 2));
    f.put('\x5a');
  }
  const std::string before = slurp(ckpt(run, 2) + "/model.h5");
  EXPECT_NE(gmod_train(0, cfg, {"schedule.exit_at_step=3"}), 0);
  std::string log = slurp(cfg + ".log");
  EXPECT_NE(log.find("resume: auto: " + run + "/checkpoints has 2 checkpoint(s) and none is valid:\n  " + ckpt(run, 2) +
                     ": model.h5 CRC-32"),
            std::string::npos) << log;
  EXPECT_NE(log.find("set resume=auto_or_scratch"), std::string::npos) << log;
  EXPECT_EQ(slurp(ckpt(run, 2) + "/model.h5"), before);  // untouched
  EXPECT_EQ(step_metrics(run).size(), 2u);               // nothing trained

  std::ofstream(run + "/metrics.jsonl", std::ios::app) << "{\"step\": 3, \"loss\": 1.2";  // torn
  ASSERT_EQ(gmod_train(0, cfg, {"schedule.exit_at_step=3", "resume=auto_or_scratch"}), 0) << slurp(cfg + ".log");
  log = slurp(cfg + ".log");
  EXPECT_NE(log.find("removed a torn last line of 23 bytes"), std::string::npos) << log;
  EXPECT_NE(log.find("resume: no valid checkpoint in " + run + "/checkpoints, starting from scratch"), std::string::npos);
  std::vector<int64_t> order;
  step_metrics(run, &order);  // every line parses
  EXPECT_EQ(order, (std::vector<int64_t>{1, 2, 1, 2, 3}));
  for (int64_t s : {1, 2}) EXPECT_TRUE(std::filesystem::exists(ckpt(run, s) + ".corrupt/model.h5")) << s;
  EXPECT_EQ(slurp(ckpt(run, 2) + ".corrupt/model.h5"), before);
  EXPECT_EQ(gmod::CheckpointManager::verify(ckpt(run, 3)), "");
  EXPECT_EQ(gmod::CheckpointManager::verify(ckpt(run, 2)), "");  // the new run's own
  EXPECT_FALSE(std::filesystem::exists(ckpt(run, 1)));            // the new run's own, pruned (keep_last 2)
}

// Checkpoint ownership: retention and re-saves never delete a checkpoint another job wrote unless it verifies; scan()
// reports every newer failure; set-aside directories keep their contents and get unique names.
#include <nlohmann/json.hpp>

#include "tests/trainer/checkpoint_fixture.h"

// Checkpoints of another job (an earlier run in this run dir) are deleted by retention only when their manifest is
// complete and consistent (their data are not re-read: checked when written); one whose manifest is not is set
// aside as step-N.corrupt, a save over another job's step-N keeps it as step-N.superseded; this job's own are
// deleted and replaced as before.
TEST(Checkpoint, AnotherJobsCorruptCheckpointIsNeverDeleted) {
  TempDir run;
  Fixture fx;
  CheckpointManager m(run.str());
  for (int64_t step : {5, 10, 20, 30}) save_sequential(run.str(), fx, step, 2, /*keep=*/0, nullptr, "old-job");
  EXPECT_EQ(CheckpointManager::writer_job(m.checkpoints_dir() + "/step-10"), "old-job");
  {  // step-10's manifest lists a rank file more than its world size: inconsistent, found without reading data
    std::ifstream in(m.checkpoints_dir() + "/step-10/manifest.json");
    nlohmann::json man = nlohmann::json::parse(in);
    man["world_size"] = 1;
    std::ofstream(m.checkpoints_dir() + "/step-10/manifest.json") << man.dump();
  }
  // step-5's data are damaged: retention does not read them (no 100-GB read inside a save) and deletes it.
  flip_byte(m.checkpoints_dir() + "/step-5/model.h5", fs::file_size(m.checkpoints_dir() + "/step-5/model.h5") / 2);
  Warnings w;
  save_sequential(run.str(), fx, 40, 2, /*keep=*/2, nullptr, "", w.fn());
  EXPECT_EQ(CheckpointManager::writer_job(m.checkpoints_dir() + "/step-40"), gmod::this_job_id());
  // 40, 30 kept; 20 and 5 (old job, manifests fine) deleted; 10 (inconsistent manifest) set aside with a warning.
  std::vector<int64_t> steps;
  for (const auto& e : m.list()) steps.push_back(e.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{40, 30}));
  EXPECT_FALSE(fs::exists(m.checkpoints_dir() + "/step-20"));
  EXPECT_FALSE(fs::exists(m.checkpoints_dir() + "/step-5"));
  EXPECT_TRUE(fs::exists(m.checkpoints_dir() + "/step-10.corrupt/model.h5"));
  ASSERT_EQ(w.msgs.size(), 1u);
  EXPECT_NE(w.msgs[0].find("step-10 fails verification"), std::string::npos) << w.msgs[0];
  EXPECT_NE(w.msgs[0].find("kept as " + m.checkpoints_dir() + "/step-10.corrupt"), std::string::npos) << w.msgs[0];

  // This job saving a step another job already has: the old one is kept aside, never deleted.
  save_sequential(run.str(), Fixture(1), 50, 2, /*keep=*/0, nullptr, "old-job");
  Warnings w2;
  const std::string dir = save_sequential(run.str(), fx, 50, 2, /*keep=*/0, nullptr, "", w2.fn());
  EXPECT_EQ(CheckpointManager::verify(dir), "");
  EXPECT_EQ(CheckpointManager::verify(m.checkpoints_dir() + "/step-50.superseded"), "");
  EXPECT_TRUE(bit_equal(CheckpointReader(m.checkpoints_dir() + "/step-50.superseded").read_model_tensor("embed.weight"),
                        Fixture(1).model[2].second));
  ASSERT_EQ(w2.msgs.size(), 1u);
  EXPECT_NE(w2.msgs[0].find("was written by another job; kept as"), std::string::npos) << w2.msgs[0];
  // Set-aside directories are not listed, and a second one of the same name gets a number.
  EXPECT_EQ(m.list().size(), 3u);
  const std::string again = save_sequential(run.str(), fx, 60, 1, 0, nullptr, "old-job");
  EXPECT_EQ(m.set_aside(again, "corrupt"), again + ".corrupt");
  save_sequential(run.str(), fx, 60, 1, 0, nullptr, "old-job");
  EXPECT_EQ(m.set_aside(again, "corrupt"), again + ".corrupt.2");
}

// scan(): the newest valid one and every newer failure with its reason.
TEST(Checkpoint, ScanReportsEveryNewerFailure) {
  TempDir run;
  Fixture fx;
  for (int64_t step : {1, 2, 3}) save_sequential(run.str(), fx, step, 1, 0);
  CheckpointManager m(run.str(), [](const std::string&) {});
  ::unlink((m.checkpoints_dir() + "/step-3/manifest.json").c_str());
  flip_byte(m.checkpoints_dir() + "/step-2/model.h5", fs::file_size(m.checkpoints_dir() + "/step-2/model.h5") / 2);
  auto sc = m.scan();
  ASSERT_TRUE(sc.valid);
  EXPECT_EQ(sc.valid->step, 1);
  ASSERT_EQ(sc.failed.size(), 2u);
  EXPECT_EQ(sc.failed[0].first.step, 3);
  EXPECT_NE(sc.failed[0].second.find("manifest"), std::string::npos);
  EXPECT_NE(sc.failed[1].second.find("CRC-32"), std::string::npos);
  flip_byte(m.checkpoints_dir() + "/step-1/model.h5", fs::file_size(m.checkpoints_dir() + "/step-1/model.h5") / 2);
  sc = m.scan();
  EXPECT_FALSE(sc.valid);
  EXPECT_EQ(sc.failed.size(), 3u);
}


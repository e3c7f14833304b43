// HDF5 wrapper and checkpoint protocol: bit-exact round trips, RNG state, simulated ranks, retention, corruption,
// crash injection at every save stage, resharding input.
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/hdf5_file.h"

#include "tests/trainer/checkpoint_fixture.h"

#include "tests/common/paths.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <unistd.h>

using gmod::H5File;

// ---------------------------------------------------------------------------------------------------- HDF5 wrapper

TEST(Hdf5File, TensorRoundTripIsBitExactForEveryDtype) {
  TempDir tmp;
  const std::string path = tmp.str("t.h5");
  std::vector<std::pair<std::string, at::Tensor>> ts = {
      {"bf16", all_16bit_patterns(at::kBFloat16)},
      {"fp16", all_16bit_patterns(at::kHalf)},
      {"fp32", at::randn({7, 3, 5}, at::kFloat) * 1e30},
      {"fp64", at::randn({11}, at::kDouble)},
      {"i64", at::randint(-(int64_t(1) << 60), int64_t(1) << 60, {9}, at::kLong)},
      {"i32", at::randint(-1000000, 1000000, {4, 4}, at::kInt)},
      {"u8", at::randint(0, 256, {33}, at::kByte)},
      {"bool", at::rand({17}) > 0.5},
      {"scalar", at::scalar_tensor(3.5, at::kFloat)},
      {"empty", at::empty({0, 4}, at::kFloat)},
      {"grp/sub/strided", at::arange(24, at::kFloat).reshape({4, 6}).t()},
  };
  {
    H5File f = H5File::create(path);
    for (const auto& [n, t] : ts) f.write_tensor(n, t);
    f.close();
  }
  H5File f = H5File::open(path);
  for (const auto& [n, t] : ts) {
    at::Tensor back = f.read_tensor(n);
    EXPECT_TRUE(bit_equal(back, t.contiguous())) << n;
    EXPECT_EQ(f.tensor_info(n).dtype, t.scalar_type()) << n;
  }
  EXPECT_EQ(f.attr_string("bf16", "dtype"), "bfloat16");
  EXPECT_EQ(f.attr_string("fp16", "dtype"), "float16");
  EXPECT_TRUE(f.exists("grp/sub/strided"));
  EXPECT_FALSE(f.exists("grp/nope/x"));
  auto names = f.list_datasets("/");
  EXPECT_EQ(names.size(), ts.size() - 1);  // grp is a group
}

TEST(Hdf5File, AttributesRoundTrip) {
  TempDir tmp;
  const std::string path = tmp.str("a.h5");
  nlohmann::json j = {{"layers", 32}, {"name", "llava"}, {"big", std::string(100000, 'x')}};
  {
    H5File f = H5File::create(path);
    f.set_attr("/", "s", "hello");
    f.set_attr("/", "i", int64_t(-(int64_t(1) << 40)));
    f.set_attr("/", "d", 0.1);
    f.set_attr("/", "s", "replaced");
    f.set_json_attr("/", "cfg", j);
    f.close();
  }
  H5File f = H5File::open(path);
  EXPECT_EQ(f.attr_string("/", "s"), "replaced");
  EXPECT_EQ(f.attr_int("/", "i"), -(int64_t(1) << 40));
  EXPECT_EQ(f.attr_double("/", "d"), 0.1);
  EXPECT_EQ(f.attr_json("/", "cfg"), j);
  EXPECT_TRUE(f.has_attr("/", "d"));
  EXPECT_FALSE(f.has_attr("/", "nope"));
}

TEST(Hdf5File, ErrorsNameFileAndDataset) {
  TempDir tmp;
  const std::string path = tmp.str("e.h5");
  {
    H5File f = H5File::create(path);
    f.write_tensor("x", at::ones({2}));
    EXPECT_THROW(f.write_tensor("x", at::ones({2})), gmod::Hdf5Error);  // exists
    f.close();
  }
  H5File f = H5File::open(path);
  try {
    f.read_tensor("missing_weight");
    FAIL() << "no throw";
  } catch (const gmod::Hdf5Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("missing_weight"), std::string::npos) << m;
    EXPECT_NE(m.find(path), std::string::npos) << m;
  }
  try {
    H5File::open(tmp.str("nope.h5"));
    FAIL() << "no throw";
  } catch (const gmod::Hdf5Error& e) {
    EXPECT_NE(std::string(e.what()).find("nope.h5"), std::string::npos);
  }
}

TEST(Hdf5File, DatasetChecksumDetectsFlippedByte) {
  TempDir tmp;
  const std::string path = tmp.str("c.h5");
  at::Tensor t = at::randn({64, 64});
  {
    H5File f = H5File::create(path);
    f.write_tensor("w", t);
    f.close();
  }
  haddr_t off;
  {
    hid_t fid = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t ds = H5Dopen2(fid, "w", H5P_DEFAULT);
    off = H5Dget_offset(ds);
    H5Dclose(ds);
    H5Fclose(fid);
  }
  flip_byte(path, off + 1000);
  H5File f = H5File::open(path);
  try {
    f.read_tensor("w");
    FAIL() << "no throw";
  } catch (const gmod::Hdf5Error& e) {
    EXPECT_NE(std::string(e.what()).find("checksum mismatch for dataset 'w'"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(bit_equal(f.read_tensor("w", /*verify=*/false), t));
}

TEST(Hdf5File, ReadIntoFillsTheGivenTensorsMemoryOrCopiesAndRefusesAnotherSize) {
  // A same-world resume reads the optimizer shard straight into the live buffers: same memory, same bits.
  TempDir tmp;
  const std::string path = tmp.str("into.h5");
  const at::Tensor t = at::randn({6, 5});
  {
    H5File f = H5File::create(path);
    f.write_tensor("w", t);
    f.close();
  }
  H5File f = H5File::open(path);
  at::Tensor flat = at::zeros({30});
  const void* mem = flat.data_ptr();
  f.read_tensor_into("w", flat);
  EXPECT_EQ(flat.data_ptr(), mem);
  EXPECT_TRUE(bit_equal(flat, t.reshape({-1})));
  // Another dtype or a strided destination: through a temporary, values converted / placed as a copy_ would.
  at::Tensor wide = at::zeros({30}, at::kDouble);
  f.read_tensor_into("w", wide);
  EXPECT_TRUE(bit_equal(wide, t.reshape({-1}).to(at::kDouble)));
  at::Tensor strided = at::zeros({5, 6}).t();
  f.read_tensor_into("w", strided);
  EXPECT_TRUE(bit_equal(strided.contiguous(), t));
  at::Tensor small = at::zeros({29});
  try {
    f.read_tensor_into("w", small);
    FAIL() << "no throw";
  } catch (const gmod::Hdf5Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("dataset 'w'"), std::string::npos) << m;
    EXPECT_NE(m.find("into.h5"), std::string::npos) << m;
    EXPECT_NE(m.find("30 elements"), std::string::npos) << m;
  }
}

// ---------------------------------------------------------------------------------------------------- checkpoints

TEST(Checkpoint, RngStateRoundTripGivesSameSequence) {
  TempDir run;
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(42);
  (void)at::randn({100}, g);  // advance
  Fixture fx;
  RankState rs = fx.rank_state(0, 1, 5);
  rs.rng_state = gmod::generator_state_bytes(g);
  at::Tensor expect = at::randn({1000}, g);
  at::Tensor expect_int = at::randint(0, 1 << 30, {100}, g);
  CheckpointWriter(run.str(), 0, 1, {}).save(fx.content(5), rs);

  auto latest = CheckpointManager(run.str()).find_latest_valid();
  ASSERT_TRUE(latest);
  RankState back = CheckpointReader(latest->path).read_rank_state(0);
  EXPECT_EQ(back.rng_state, rs.rng_state);
  at::Generator g2 = at::make_generator<at::CPUGeneratorImpl>(7);
  gmod::set_generator_state_bytes(g2, back.rng_state);
  EXPECT_TRUE(bit_equal(at::randn({1000}, g2), expect));
  EXPECT_TRUE(bit_equal(at::randint(0, 1 << 30, {100}, g2), expect_int));
}

TEST(Checkpoint, ModelAndTrainerStateRoundTrip) {
  TempDir run;
  Fixture fx;
  std::string dir = save_sequential(run.str(), fx, 100, 1);
  EXPECT_EQ(dir, run.str("checkpoints/step-100"));
  EXPECT_EQ(CheckpointManager::verify(dir), "");
  CheckpointReader r(dir);
  EXPECT_EQ(r.step(), 100);
  EXPECT_EQ(r.world_size(), 1);
  EXPECT_EQ(r.config(), fx.content(100).config);
  EXPECT_EQ(r.trainer_state(), fx.content(100).trainer_state);
  EXPECT_EQ(r.data_position()["consumed_samples"], 800);
  EXPECT_EQ(r.shard_layout(), fx.content(100).shard_layout);
  EXPECT_EQ(r.model_tensor_names(), (std::vector<std::string>{"layers.0.weight", "norm.weight", "embed.weight"}));
  auto m = r.read_model();
  ASSERT_EQ(m.size(), fx.model.size());
  for (size_t i = 0; i < m.size(); ++i) {
    EXPECT_EQ(m[i].first, fx.model[i].first);
    EXPECT_TRUE(bit_equal(m[i].second, fx.model[i].second)) << m[i].first;
  }
  EXPECT_TRUE(bit_equal(r.read_model_tensor("norm.weight"), fx.model[1].second));

  // Into existing parameters (requires_grad leaves), then mismatches named in errors.
  gmod::NamedTensors params;
  for (const auto& [n, t] : fx.model) params.emplace_back(n, at::zeros_like(t).requires_grad_(t.is_floating_point()));
  r.load_model_into(params);
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(bit_equal(params[i].second.detach(), fx.model[i].second));

  gmod::NamedTensors bad_shape = {{"layers.0.weight", at::zeros({4, 3}, at::kBFloat16)}};
  try {
    r.load_model_into(bad_shape, /*strict=*/false);
    FAIL() << "no throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("shape"), std::string::npos) << e.what();
  }
  gmod::NamedTensors bad_dtype = {{"norm.weight", at::zeros({4}, at::kBFloat16)}};
  EXPECT_THROW(r.load_model_into(bad_dtype, false), std::runtime_error);
  gmod::NamedTensors missing = {{"lm_head.weight", at::zeros({4})}};
  try {
    r.load_model_into(missing, false);
    FAIL() << "no throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("lm_head.weight"), std::string::npos) << e.what();
  }
  gmod::NamedTensors partial = {params[0]};
  EXPECT_THROW(r.load_model_into(partial, /*strict=*/true), std::runtime_error);  // norm.weight unexpected
  EXPECT_NO_THROW(r.load_model_into(partial, /*strict=*/false));
}

// Two ranks as threads with a real barrier; then resharding input: all ranks' shards reassemble the flat vectors.
TEST(Checkpoint, TwoRanksWithThreadsWriteAndReadBack) {
  TempDir run;
  Fixture fx;
  ThreadBarrier barrier(2);
  std::vector<std::string> dirs(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        CheckpointOptions o;
        o.barrier = [&] { barrier.wait(); };
        dirs[size_t(r)] = CheckpointWriter(run.str(), r, 2, o).save(fx.content(7), fx.rank_state(r, 2, 7));
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  EXPECT_EQ(dirs[0], dirs[1]);
  EXPECT_EQ(CheckpointManager::verify(dirs[0]), "");

  CheckpointReader r(dirs[0]);
  EXPECT_EQ(r.world_size(), 2);
  auto states = r.read_all_rank_states();
  ASSERT_EQ(states.size(), 2u);
  std::vector<at::Tensor> masters, avgs, sqs;
  for (int k = 0; k < 2; ++k) {
    const RankState& s = states[size_t(k)];
    EXPECT_EQ(s.rank, k);
    EXPECT_EQ(s.world_size, 2);
    RankState want = fx.rank_state(k, 2, 7);
    EXPECT_EQ(s.meta, want.meta);
    EXPECT_EQ(s.rng_state, want.rng_state);
    EXPECT_EQ(s.shard_layout, fx.content(7).shard_layout);
    ASSERT_EQ(s.tensors.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(s.tensors[i].first, want.tensors[i].first);
      EXPECT_TRUE(bit_equal(s.tensors[i].second, want.tensors[i].second)) << s.tensors[i].first;
    }
    masters.push_back(s.tensors[0].second);
    avgs.push_back(s.tensors[1].second);
    sqs.push_back(s.tensors[2].second);
  }
  EXPECT_TRUE(bit_equal(at::cat(masters), fx.flat_master));
  EXPECT_TRUE(bit_equal(at::cat(avgs), fx.flat_avg));
  EXPECT_TRUE(bit_equal(at::cat(sqs), fx.flat_sq));
  EXPECT_THROW(r.read_rank_state(2), std::out_of_range);
}

TEST(Checkpoint, SequentialRanksWithNoOpBarrier) {
  TempDir run;
  Fixture fx;
  std::string dir = save_sequential(run.str(), fx, 3, 3);
  CheckpointReader r(dir);
  EXPECT_EQ(r.world_size(), 3);
  auto states = r.read_all_rank_states();
  std::vector<at::Tensor> masters;
  for (const auto& s : states) masters.push_back(s.tensors[0].second);
  EXPECT_TRUE(bit_equal(at::cat(masters), fx.flat_master));
  EXPECT_EQ(r.manifest()["files"].size(), 5u);  // model, trainer-state, 3 optim files; no side files left
  EXPECT_FALSE(fs::exists(fs::path(dir) / "optim-rank-0.h5.sum"));
}

// A tampered manifest world_size is named as inconsistent with the rank files it lists (it used to surface as
// "reshard_state without saved states" at resume).
TEST(Checkpoint, ManifestWorldSizeMustMatchItsRankFiles) {
  TempDir run;
  Fixture fx;
  const std::string dir = save_sequential(run.str(), fx, 3, 2);
  const std::string mpath = (fs::path(dir) / "manifest.json").string();
  nlohmann::json m;
  std::ifstream(mpath) >> m;
  const auto tamper = [&](const nlohmann::json& world) {
    nlohmann::json t = m;
    t["world_size"] = world;
    std::ofstream(mpath) << t.dump();
    return CheckpointManager::verify(dir);
  };
  EXPECT_EQ(tamper(1), "manifest.json is inconsistent: world_size 1 but it lists optim-rank-1.h5");
  EXPECT_EQ(tamper(3),
            "manifest.json is inconsistent: world_size 3 but it lists the optimizer files of 2 rank(s)");
  EXPECT_EQ(tamper(0), "manifest.json world_size 0 is not a rank count (1 or more)");
  EXPECT_EQ(tamper(4294967298ull), "manifest.json world_size 4294967298 is not a rank count (1 or more)");
  EXPECT_EQ(tamper("2"), "manifest.json world_size \"2\" is not a rank count (1 or more)");
  EXPECT_EQ(tamper(2), "");
  // The manifest and trainer-state.json must agree too (a manifest taken over from another save).
  std::ofstream(mpath) << m.dump();
  nlohmann::json st;
  std::ifstream(fs::path(dir) / "trainer-state.json") >> st;
  st["world_size"] = 3;
  std::ofstream(fs::path(dir) / "trainer-state.json") << st.dump(1);
  try {
    CheckpointReader r(dir);
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "manifest.json world_size 2 disagrees with trainer-state.json world_size 3"),
              std::string::npos)
        << e.what();
  }
}

TEST(Checkpoint, KeepLastDeletesOnlyOldOnes) {
  TempDir run;
  Fixture fx;
  for (int64_t step : {10, 20, 30, 40, 50}) save_sequential(run.str(), fx, step, 2, /*keep=*/2);
  CheckpointManager m(run.str());
  auto l = m.list();
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(l[0].step, 50);
  EXPECT_EQ(l[1].step, 40);
  for (const auto& e : l) EXPECT_EQ(CheckpointManager::verify(e.path), "") << e.path;
  // Nothing left behind from deletions.
  for (const auto& e : fs::directory_iterator(m.checkpoints_dir()))
    EXPECT_EQ(e.path().extension(), "") << e.path();

  EXPECT_THROW(CheckpointWriter(run.str(), 0, 1, CheckpointOptions{1, {}, {}, {}, {}}), std::invalid_argument);
  EXPECT_THROW(CheckpointWriter(run.str(), 0, 2, CheckpointOptions{}), std::invalid_argument);  // no barrier
  // keep_last 0 keeps everything.
  TempDir run2;
  for (int64_t step : {1, 2, 3}) save_sequential(run2.str(), fx, step, 1, /*keep=*/0);
  EXPECT_EQ(CheckpointManager(run2.str()).list().size(), 3u);
}

TEST(Checkpoint, ResaveOfSameStepReplacesIt) {
  TempDir run;
  Fixture a(0), b(1);
  save_sequential(run.str(), a, 5, 1);
  std::string dir = save_sequential(run.str(), b, 5, 1);
  EXPECT_EQ(CheckpointManager::verify(dir), "");
  EXPECT_TRUE(bit_equal(CheckpointReader(dir).read_model_tensor("embed.weight"), b.model[2].second));
  EXPECT_EQ(CheckpointManager(run.str()).list().size(), 1u);
}

TEST(Checkpoint, CorruptOrTruncatedNewestIsSkippedWithWarning) {
  for (const char* damage : {"flip", "truncate", "delete-manifest", "missing-rank-file"}) {
    SCOPED_TRACE(damage);
    TempDir run;
    Fixture fx;
    save_sequential(run.str(), fx, 100, 2);
    std::string newest = save_sequential(run.str(), fx, 200, 2);
    const std::string model = newest + "/model.h5";
    std::string d = damage;
    if (d == "flip") {
      flip_byte(model, fs::file_size(model) / 2);
    } else if (d == "truncate") {
      fs::resize_file(model, fs::file_size(model) - 100);
    } else if (d == "delete-manifest") {
      ::unlink((newest + "/manifest.json").c_str());
    } else {
      ::unlink((newest + "/optim-rank-1.h5").c_str());
    }
    Warnings w;
    CheckpointManager m(run.str(), w.fn());
    auto latest = m.find_latest_valid();
    ASSERT_TRUE(latest);
    EXPECT_EQ(latest->step, 100);
    ASSERT_EQ(w.msgs.size(), 1u);
    EXPECT_NE(w.msgs[0].find(newest), std::string::npos) << w.msgs[0];
    if (d == "flip") {
      EXPECT_NE(w.msgs[0].find("CRC-32"), std::string::npos) << w.msgs[0];
    }
    if (d == "truncate") {
      EXPECT_NE(w.msgs[0].find("truncated"), std::string::npos) << w.msgs[0];
    }
    if (d == "delete-manifest") {
      EXPECT_NE(w.msgs[0].find("manifest"), std::string::npos) << w.msgs[0];
    }
    if (d == "missing-rank-file") {
      EXPECT_NE(w.msgs[0].find("optim-rank-1.h5"), std::string::npos) << w.msgs[0];
    }
    EXPECT_THROW(CheckpointReader(newest).verify(), std::runtime_error);
  }
}

TEST(Checkpoint, TmpDirWithoutManifestIsIgnoredAndCleanedAtNextSave) {
  TempDir run;
  Fixture fx;
  save_sequential(run.str(), fx, 10, 1);
  CheckpointManager m(run.str());
  // A crash mid-save of step 20: partial files in step-20.tmp, and an unrelated stale tmp.
  fs::create_directories(m.checkpoints_dir() + "/step-20.tmp");
  std::ofstream(m.checkpoints_dir() + "/step-20.tmp/optim-rank-0.h5") << "partial";
  fs::create_directories(m.checkpoints_dir() + "/step-15.tmp");
  Warnings w;
  auto latest = CheckpointManager(run.str(), w.fn()).find_latest_valid();
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->step, 10);
  EXPECT_TRUE(w.msgs.empty());
  EXPECT_EQ(m.list().size(), 1u);

  save_sequential(run.str(), fx, 30, 1);
  EXPECT_FALSE(fs::exists(m.checkpoints_dir() + "/step-20.tmp"));
  EXPECT_FALSE(fs::exists(m.checkpoints_dir() + "/step-15.tmp"));
  EXPECT_EQ(m.find_latest_valid()->step, 30);
}

TEST(Checkpoint, NoCheckpointsGivesNothing) {
  TempDir run;
  EXPECT_FALSE(CheckpointManager(run.str()).find_latest_valid());
  EXPECT_TRUE(CheckpointManager(run.str()).list().empty());
}

// A crash (exception from the stage hook) after every stage of the protocol, on rank 0 of 2 simulated ranks: the
// previous checkpoint always survives, the new one counts only once renamed, and the next save recovers.
TEST(Checkpoint, CrashAtEveryStageNeverLosesPreviousCheckpoint) {
  for (int k = 0; k < gmod::kNumSaveStages; ++k) {
    const SaveStage crash_at = SaveStage(k);
    SCOPED_TRACE(gmod::save_stage_name(crash_at));
    TempDir run;
    Fixture fx;
    save_sequential(run.str(), fx, 10, 2, /*keep=*/2);
    save_sequential(run.str(), fx, 20, 2, /*keep=*/2);
    struct Crash {};
    EXPECT_THROW(save_sequential(run.str(), fx, 30, 2, 2,
                                 [&](SaveStage s) {
                                   if (s == crash_at) throw Crash{};
                                 }),
                 Crash);
    Warnings w;
    auto latest = CheckpointManager(run.str(), w.fn()).find_latest_valid();
    ASSERT_TRUE(latest);
    EXPECT_EQ(latest->step, k >= int(SaveStage::kRenamed) ? 30 : 20);
    EXPECT_TRUE(w.msgs.empty()) << w.msgs[0];
    EXPECT_EQ(CheckpointManager::verify(run.str("checkpoints/step-20")), "");

    // The retry cleans up and commits.
    save_sequential(run.str(), fx, 30, 2, 2);
    CheckpointManager m(run.str());
    EXPECT_EQ(m.find_latest_valid()->step, 30);
    auto l = m.list();
    ASSERT_EQ(l.size(), 2u);
    EXPECT_EQ(l[1].step, 20);
    for (const auto& e : fs::directory_iterator(m.checkpoints_dir()))
      EXPECT_EQ(e.path().extension(), "") << e.path();
  }
}

// A rank-1 crash before rank 0 commits (rank 0 never runs): nothing new counts.
TEST(Checkpoint, CrashOfOtherRankLeavesOnlyTmp) {
  TempDir run;
  Fixture fx;
  save_sequential(run.str(), fx, 10, 2);
  CheckpointOptions o;
  o.barrier = [] {};
  CheckpointWriter(run.str(), 1, 2, o).save(fx.content(20), fx.rank_state(1, 2, 20));  // rank 0 "died"
  EXPECT_TRUE(fs::exists(run.str("checkpoints/step-20.tmp/optim-rank-1.h5")));
  EXPECT_EQ(CheckpointManager(run.str()).find_latest_valid()->step, 10);
}

// Writes a deterministic checkpoint for tests/fixtures/check_h5_layout.py when GMOD_CKPT_EXPORT_DIR is set.
TEST(Checkpoint, ExportForH5pyCheck) {
  const char* out = std::getenv("GMOD_CKPT_EXPORT_DIR");
  if (!out) GTEST_SKIP() << "set GMOD_CKPT_EXPORT_DIR=<run dir> to write a checkpoint for check_h5_layout.py";
  Fixture fx;
  std::string dir = save_sequential(out, fx, 100, 2);
  std::cout << "wrote " << dir << std::endl;
}

// A file's CRC read in parallel ranges (crc32_file: up to 8 threads, ranges of >= 64 MiB, joined with
// crc32_combine) equals one sequential pass over its bytes, for a size that is not a multiple of anything, and
// for small and empty files (one range).
TEST(Checkpoint, ParallelFileCrcEqualsOneSequentialPass) {
  TempDir dir;
  for (const size_t n : {size_t(0), size_t(1000), (size_t(129) << 20) + 12345}) {
    std::vector<unsigned char> bytes(n);
    uint64_t x = 88172645463325252ull;
    for (auto& b : bytes) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      b = static_cast<unsigned char>(x);
    }
    const std::string path = dir.str("f" + std::to_string(n));
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(n));
    uint64_t size = 7;
    EXPECT_EQ(gmod::crc32_file(path, &size), gmod::crc32_bytes(bytes.data(), n)) << n;
    EXPECT_EQ(size, n);
  }
}

// Checkpoints whose model weights every rank writes a share of (model.h5 + model-rank-<r>.h5), the file CRC taken
// from the tensors' own CRCs plus the metadata, the weights read once per job and broadcast, and asynchronous saves
// (write_files on a background thread, commit on rank 0).
#include "tests/trainer/checkpoint_fixture.h"

#include "trainer/checkpoint/async_save.h"
#include "trainer/checkpoint/file_crc.h"
#include "trainer/checkpoint/hdf5_file.h"

#include <map>
#include <thread>

namespace {

// fx's content for rank r of `world` with the weights split as the trainer splits them.
CheckpointContent split_content(const Fixture& fx, int64_t step, int r, int world) {
  CheckpointContent c = fx.content(step);
  std::vector<int64_t> bytes;
  for (const auto& [n, t] : fx.model) bytes.push_back(t.numel() * int64_t(t.element_size()));
  const std::vector<int> owner = gmod::split_model_by_bytes(bytes, world);
  c.model.clear();
  for (size_t i = 0; i < fx.model.size(); ++i) {
    c.model_names.push_back(fx.model[i].first);
    if (owner[i] == r) c.model.push_back(fx.model[i]);
  }
  return c;
}

std::string save_split(const std::string& run, const Fixture& fx, int64_t step, int world) {
  std::string out;
  for (int r = world - 1; r >= 0; --r) {
    CheckpointOptions o;
    o.barrier = [] {};
    out = CheckpointWriter(run, r, world, o).save(split_content(fx, step, r, world), fx.rank_state(r, world, step));
  }
  return out;
}

void expect_model(const CheckpointReader& r, const Fixture& fx) {
  auto m = r.read_model();
  ASSERT_EQ(m.size(), fx.model.size());
  for (size_t i = 0; i < m.size(); ++i) {
    EXPECT_EQ(m[i].first, fx.model[i].first);
    EXPECT_TRUE(bit_equal(m[i].second, fx.model[i].second)) << m[i].first;
  }
}

}  // namespace

TEST(CheckpointParts, SplitBalancesBytesAndIsDeterministic) {
  const std::vector<int64_t> bytes{100, 10, 60, 50, 40, 1};
  const auto owner = gmod::split_model_by_bytes(bytes, 2);
  EXPECT_EQ(owner, gmod::split_model_by_bytes(bytes, 2));
  std::vector<int64_t> load(2, 0);
  for (size_t i = 0; i < bytes.size(); ++i) load[size_t(owner[i])] += bytes[i];
  // Largest first onto the least loaded: 100 -> 0, 60 -> 1, 50 -> 1 (110), 40 -> 0 (140), 10 -> 1, 1 -> 1.
  EXPECT_EQ(load, (std::vector<int64_t>{140, 121}));
  EXPECT_EQ(owner, (std::vector<int>{0, 1, 1, 1, 0, 1}));
  EXPECT_EQ(gmod::split_model_by_bytes(bytes, 1), std::vector<int>(bytes.size(), 0));
  EXPECT_THROW(gmod::split_model_by_bytes(bytes, 0), std::invalid_argument);
}

// Three ranks each write a share; the checkpoint verifies, reads back bitwise whole and tensor by tensor, and
// model.h5 indexes the other parts.
TEST(CheckpointParts, EveryRankWritesItsShareAndTheReaderJoinsThem) {
  TempDir run;
  Fixture fx;
  const std::string dir = save_split(run.str(), fx, 7, 3);
  EXPECT_EQ(CheckpointManager::verify(dir), "");
  CheckpointReader r(dir);
  EXPECT_EQ(r.model_files(), (std::vector<std::string>{"model.h5", "model-rank-1.h5", "model-rank-2.h5"}));
  EXPECT_EQ(r.model_tensor_names(), (std::vector<std::string>{"layers.0.weight", "norm.weight", "embed.weight"}));
  expect_model(r, fx);
  EXPECT_TRUE(bit_equal(r.read_model_tensor("embed.weight"), fx.model[2].second));
  for (const char* f : {"model-rank-1.h5", "model-rank-2.h5"})
    EXPECT_TRUE(r.manifest()["files"].contains(f)) << f;
  // Each part holds something (3 tensors over 3 ranks).
  for (const char* f : {"model.h5", "model-rank-1.h5", "model-rank-2.h5"})
    EXPECT_EQ(gmod::H5File::open(dir + "/" + f).list_datasets("/").size(), 1u) << f;
  // A damaged part is found by the manifest check.
  flip_byte(dir + "/model-rank-2.h5", fs::file_size(dir + "/model-rank-2.h5") - 9);
  EXPECT_NE(CheckpointManager::verify(dir).find("model-rank-2.h5"), std::string::npos);
}

// A rank that left out a tensor it was given (a bug in the split): the commit refuses, naming the tensor, and
// nothing counts as a checkpoint.
TEST(CheckpointParts, CommitRefusesPartsThatMissATensor) {
  TempDir run;
  Fixture fx;
  save_split(run.str(), fx, 5, 2);
  CheckpointOptions o;
  o.barrier = [] {};
  CheckpointContent c1 = split_content(fx, 9, 1, 2);
  const std::string dropped = c1.model.at(0).first;
  c1.model.erase(c1.model.begin());
  CheckpointWriter(run.str(), 1, 2, o).save(c1, fx.rank_state(1, 2, 9));
  try {
    CheckpointWriter(run.str(), 0, 2, o).save(split_content(fx, 9, 0, 2), fx.rank_state(0, 2, 9));
    FAIL() << "no throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("no rank wrote model tensor '" + dropped + "'"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(CheckpointManager(run.str()).find_latest_valid()->step, 5);
}

// The file CRC from the tensors' CRCs plus a read of the rest equals a full read's; inconsistent regions fall back
// to the full read.
TEST(CheckpointParts, FileCrcFromKnownRegionsEqualsFullRead) {
  TempDir tmp;
  const std::string path = tmp.str("t.h5");
  std::vector<gmod::KnownCrcRegion> known;
  {
    gmod::H5File f = gmod::H5File::create(path);
    f.set_attr("/", "x", int64_t(3));
    f.write_tensor("a", at::arange(100000, at::kFloat));
    f.write_tensor("g/b", all_16bit_patterns(at::kBFloat16));
    f.write_tensor("s", at::scalar_tensor(2.5));
    f.write_tensor("empty", at::empty({0}));
    known = f.written_regions();
    f.close();
  }
  ASSERT_EQ(known.size(), 3u);  // the empty dataset has no bytes in the file
  uint64_t size_a = 0, size_b = 0;
  bool used = false;
  const uint32_t full = gmod::crc32_file(path, &size_a);
  EXPECT_EQ(gmod::crc32_file_with_known(path, known, &size_b, &used), full);
  EXPECT_TRUE(used);
  EXPECT_EQ(size_a, size_b);
  // A wrong region CRC gives another file CRC (what the manifest check would then refuse).
  auto wrong = known;
  wrong[0].crc ^= 1;
  EXPECT_NE(gmod::crc32_file_with_known(path, wrong), full);
  // Overlapping or out-of-file regions: the whole file is read instead.
  auto overlap = known;
  overlap.push_back({known[0].offset + 4, 8, 0});
  EXPECT_EQ(gmod::crc32_file_with_known(path, overlap, nullptr, &used), full);
  EXPECT_FALSE(used);
  EXPECT_EQ(gmod::crc32_file_with_known(path, {{size_a - 4, 8, 0}}, nullptr, &used), full);
  EXPECT_FALSE(used);
}

// The weights read once per job: each part by one rank (threads as ranks), the others receive them by broadcast.
TEST(CheckpointParts, SharedLoadReadsEachPartOnceAndBroadcasts) {
  TempDir run;
  Fixture fx;
  const std::string dir = save_split(run.str(), fx, 3, 2);
  const int world = 2;
  ThreadBarrier barrier(world);
  std::vector<at::Tensor> slot(1);
  std::map<int, int> reads_by_root;
  std::mutex m;
  std::vector<gmod::NamedTensors> params(world);
  for (int r = 0; r < world; ++r)
    for (const auto& [n, t] : fx.model) params[size_t(r)].emplace_back(n, at::zeros_like(t));
  auto rank_main = [&](int r) {
    CheckpointReader::ModelShare share;
    share.rank = r;
    share.world_size = world;
    share.broadcast = [&](at::Tensor& t, int root) {
      if (r == root) {
        slot[0] = t.clone();
        std::lock_guard<std::mutex> l(m);
        ++reads_by_root[root];
      }
      barrier.wait();
      if (r != root) t.copy_(slot[0]);
      barrier.wait();
    };
    CheckpointReader(dir).load_model_into(params[size_t(r)], true, share);
  };
  std::thread t1(rank_main, 1);
  rank_main(0);
  t1.join();
  for (int r = 0; r < world; ++r)
    for (size_t i = 0; i < fx.model.size(); ++i)
      EXPECT_TRUE(bit_equal(params[size_t(r)][i].second, fx.model[i].second)) << r << " " << fx.model[i].first;
  // model.h5 holds 1 tensor (rank 0 reads it), model-rank-1.h5 the other 2 (rank 1 reads them).
  EXPECT_EQ(reads_by_root, (std::map<int, int>{{0, 1}, {1, 2}}));
}

// The host memory of asynchronous saves: one buffer of exactly the aligned sizes, reused by a later snapshot that
// fits (same storage, new contents), grown for a larger one; a snapshot beyond what begin() was told is an error.
TEST(CheckpointParts, SnapshotArenaIsExactlySizedAndReused) {
  gmod::SnapshotArena a;
  const at::Tensor x = at::arange(10, at::kFloat), y = at::arange(3, at::kDouble).view({3, 1});
  a.begin({40, 24}, false);
  EXPECT_EQ(a.capacity_bytes(), 64 + 64);  // each copy starts on a 64-byte boundary
  at::Tensor hx = a.take(x), hy = a.take(y);
  EXPECT_TRUE(bit_equal(hx, x));
  EXPECT_TRUE(bit_equal(hy, y));
  EXPECT_EQ(hy.sizes(), y.sizes());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(hy.data_ptr()) % 64, 0u);
  EXPECT_THROW(a.take(x), std::logic_error);  // begin() was told of two tensors
  void* first = hx.data_ptr();
  a.begin({40}, false);  // fits: the same buffer
  at::Tensor again = a.take(x * 2);
  EXPECT_EQ(again.data_ptr(), first);
  EXPECT_TRUE(bit_equal(again, x * 2));
  EXPECT_EQ(a.capacity_bytes(), 128);
  a.begin({400}, false);  // grows
  EXPECT_EQ(a.capacity_bytes(), 448);
}

// Asynchronous: both ranks' files written on background threads while the "training" changes the originals; the
// commit after both are done makes a checkpoint equal to a synchronous save of the state at snapshot time.
TEST(CheckpointParts, AsyncSaveEqualsSyncSaveOfTheSnapshot) {
  TempDir sync_run, async_run;
  Fixture fx;
  const std::string sync_dir = save_split(sync_run.str(), fx, 4, 2);
  std::vector<std::unique_ptr<gmod::AsyncCheckpointSave>> saves;
  std::vector<RankState> live;
  gmod::SnapshotArena arenas[2];
  for (int r = 0; r < 2; ++r) {
    CheckpointContent c = split_content(fx, 4, r, 2);
    RankState s = fx.rank_state(r, 2, 4);
    std::vector<int64_t> sizes;
    for (const auto* ts : {&c.model, &s.tensors})
      for (const auto& [n, t] : *ts) sizes.push_back(t.numel() * int64_t(t.element_size()));
    arenas[r].begin(sizes, /*pinned=*/false);
    for (auto& [n, t] : c.model) t = arenas[r].take(t);
    for (auto& [n, t] : s.tensors) t = arenas[r].take(t);
    CheckpointOptions o;
    o.barrier = [] {};
    saves.push_back(std::make_unique<gmod::AsyncCheckpointSave>(CheckpointWriter(async_run.str(), r, 2, o),
                                                                std::move(c), std::move(s)));
  }
  // Training goes on: the originals change under the background writes (the snapshots must not).
  Fixture changed = fx;
  for (auto& [n, t] : changed.model) t.add_(1);
  changed.flat_master.add_(1);
  for (auto& s : saves) s->wait();
  for (auto& s : saves) ASSERT_EQ(s->error(), "");
  EXPECT_FALSE(fs::exists(async_run.str("checkpoints/step-4")));  // nothing counts before the commit
  const std::string dir = saves[0]->commit();
  EXPECT_EQ(CheckpointManager::verify(dir), "");
  expect_model(CheckpointReader(dir), Fixture());
  for (int r = 0; r < 2; ++r) {
    auto a = CheckpointReader(dir).read_rank_state(r), b = CheckpointReader(sync_dir).read_rank_state(r);
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    for (size_t i = 0; i < a.tensors.size(); ++i) EXPECT_TRUE(bit_equal(a.tensors[i].second, b.tensors[i].second));
  }
}

// A background write that fails (the run directory is a file): error() names it, nothing is committed, the
// previous checkpoint is untouched.
TEST(CheckpointParts, FailedAsyncWriteIsReportedAndTouchesNothing) {
  TempDir run;
  Fixture fx;
  save_split(run.str(), fx, 2, 1);
  const std::string ckdir = run.str("checkpoints");
  // step-6.tmp taken by a plain file: the background thread cannot create its directory.
  std::ofstream(ckdir + "/step-6.tmp") << "x";
  CheckpointOptions o;
  CheckpointContent c = split_content(fx, 6, 0, 1);
  gmod::AsyncCheckpointSave s(CheckpointWriter(run.str(), 0, 1, o), c, fx.rank_state(0, 1, 6));
  s.wait();
  EXPECT_TRUE(s.done());
  EXPECT_NE(s.error().find("step-6.tmp"), std::string::npos) << s.error();
  EXPECT_EQ(CheckpointManager(run.str()).find_latest_valid()->step, 2);
}

// With asynchronous saves the other ranks may already write the next save while rank 0 commits this one: the
// commit removes leftovers of earlier (and this) steps, never a later step's directory in the making.
TEST(CheckpointParts, CommitLeavesALaterSaveInTheMakingAlone) {
  TempDir run;
  Fixture fx;
  const int world = 2;
  CheckpointOptions o;
  o.barrier = [] {};
  CheckpointWriter w0(run.str(), 0, world, o), w1(run.str(), 1, world, o);
  w1.write_files(split_content(fx, 4, 1, world), fx.rank_state(1, world, 4));
  w0.write_files(split_content(fx, 4, 0, world), fx.rank_state(0, world, 4));
  // Rank 1 has started step 6 before rank 0 commits step 4; an old crashed attempt at step 2 lies beside them.
  w1.write_files(split_content(fx, 6, 1, world), fx.rank_state(1, world, 6));
  const std::string ckpts = CheckpointManager(run.str()).checkpoints_dir();
  std::filesystem::create_directories(ckpts + "/step-2.tmp");
  std::filesystem::create_directories(ckpts + "/junk.tmp");
  const std::string dir = w0.commit(split_content(fx, 4, 0, world));
  EXPECT_EQ(CheckpointManager::verify(dir), "");
  EXPECT_FALSE(std::filesystem::exists(ckpts + "/step-2.tmp"));
  EXPECT_FALSE(std::filesystem::exists(ckpts + "/junk.tmp"));
  ASSERT_TRUE(std::filesystem::exists(ckpts + "/step-6.tmp/optim-rank-1.h5"));
  // Step 6 then completes as usual.
  w0.write_files(split_content(fx, 6, 0, world), fx.rank_state(0, world, 6));
  const std::string six = w0.commit(split_content(fx, 6, 0, world));
  EXPECT_EQ(CheckpointManager::verify(six), "");
  expect_model(CheckpointReader(six), fx);
}

// Tests for model/safetensors.{h,cpp}: round trips, Python-written fixtures, sharded checkpoints, every rejected
// malformed input (messages must name the file and tensor), copy_into, and that opening maps instead of reading.
#include "model/safetensors.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>

using gmod::copy_into;
using gmod::save_safetensors;
using gmod::save_safetensors_sharded;
using gmod::SafetensorsCheckpoint;
using gmod::SafetensorsFile;

namespace {

// Plain POSIX here: std::filesystem operations resolve to libtorch.so's interposed copies, and remove_all crashes.
std::string fixtures_dir() {
  if (const char* s = std::getenv("GMOD_SOURCE_DIR"))
    if (*s) return std::string(s) + "/tests/fixtures/safetensors";
  std::string f = __FILE__;  // .../tests/model/test_safetensors.cpp
  f = f.substr(0, f.find_last_of('/'));
  return f.substr(0, f.find_last_of('/')) + "/fixtures/safetensors";
}

bool path_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}
uint64_t size_of(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}
void mkdirs(const std::string& p) { ::mkdir(p.c_str(), 0755); }
void rm_rf(const std::string& p) {
  ::nftw(p.c_str(), [](const char* f, const struct stat*, int, struct FTW*) { return ::remove(f); }, 16,
         FTW_DEPTH | FTW_PHYS);
}

// A fresh temp dir per test, removed afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* ti = ::testing::UnitTest::GetInstance()->current_test_info();
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/gmod_st_" + ti->name() + "_XXXXXX";
    ASSERT_NE(::mkdtemp(&tmpl[0]), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!dir_.empty()) rm_rf(dir_);
  }
  std::string p(const std::string& name) const { return dir_ + "/" + name; }

  // Writes a raw safetensors file: u64 header length (or `len_override`), the header text, then `buffer` bytes.
  std::string write_raw(const std::string& name, const std::string& header, size_t buffer_bytes,
                        int64_t len_override = -1) {
    std::string path = p(name);
    std::ofstream f(path, std::ios::binary);
    uint64_t n = len_override >= 0 ? static_cast<uint64_t>(len_override) : header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << header;
    f << std::string(buffer_bytes, '\x01');
    return path;
  }
  std::string write_bytes(const std::string& name, const std::string& bytes) {
    std::string path = p(name);
    std::ofstream f(path, std::ios::binary);
    f << bytes;
    return path;
  }

  std::string dir_;
};

// Runs `fn`, expects a std::runtime_error whose message contains every string in `parts`.
template <class F>
void expect_error(F&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected an exception";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    for (const auto& s : parts) EXPECT_NE(msg.find(s), std::string::npos) << "message lacks '" << s << "': " << msg;
  }
}

bool bytes_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || !a.sizes().equals(b.sizes())) return false;
  auto ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.numel() * ac.element_size()) == 0;
}

uint16_t bits16(const at::Tensor& t, int64_t i) {
  uint16_t v;
  std::memcpy(&v, static_cast<const char*>(t.data_ptr()) + 2 * i, 2);
  return v;
}

long vm_rss_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Round trips

TEST_F(SafetensorsTest, RoundTripEveryDtype) {
  at::manual_seed(0);
  std::vector<std::pair<std::string, at::Tensor>> ts = {
      {"bool", at::randint(0, 2, {3, 5}).to(at::kBool)},
      {"u8", at::randint(0, 256, {7}).to(at::kByte)},
      {"i8", at::randint(-128, 128, {2, 3}).to(at::kChar)},
      {"i16", at::randint(-32768, 32768, {4, 2}).to(at::kShort)},
      {"i32", at::randint(-1000000, 1000000, {3, 3}).to(at::kInt)},
      {"i64", at::randint(-(int64_t(1) << 40), int64_t(1) << 40, {5}).to(at::kLong)},
      {"f16", at::randn({2, 3, 4}).to(at::kHalf)},
      {"bf16", at::randn({6, 5}).to(at::kBFloat16)},
      {"f32", at::randn({4, 4})},
      {"f64", at::randn({3}, at::kDouble)},
      {"f32_transposed", at::randn({3, 5}).t()},  // non-contiguous input is written in C order
  };
  // bf16 bit patterns that must survive exactly: NaN payload, -0, inf, subnormal.
  at::Tensor special = at::tensor(std::vector<int16_t>{0x7FC1, int16_t(0x8000), 0x7F80, 0x0001, 0x3F80}, at::kShort)
                           .view(at::kBFloat16);
  ts.emplace_back("bf16_special", special);
  const std::string path = p("rt.safetensors");
  save_safetensors(path, ts);
  EXPECT_FALSE(path_exists(path + ".tmp"));

  SafetensorsFile f(path);
  ASSERT_EQ(f.names().size(), ts.size());
  for (const auto& [name, t] : ts) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(f.has(name));
    at::Tensor r = f.tensor(name);
    EXPECT_EQ(r.scalar_type(), t.scalar_type());
    EXPECT_EQ(r.sizes(), t.sizes());
    EXPECT_TRUE(r.is_contiguous());
    EXPECT_TRUE(bytes_equal(r, t));
    EXPECT_EQ(f.info(name).nbytes(), static_cast<uint64_t>(t.numel() * t.element_size()));
    EXPECT_EQ(f.info(name).shape, t.sizes().vec());
  }
  at::Tensor r = f.tensor("bf16_special");
  EXPECT_EQ(bits16(r, 0), 0x7FC1);
  EXPECT_EQ(bits16(r, 1), 0x8000);
  EXPECT_EQ(bits16(r, 3), 0x0001);
  EXPECT_EQ(f.info("bf16").dtype, "BF16");
  EXPECT_EQ(f.info("bool").dtype, "BOOL");
}

TEST_F(SafetensorsTest, ZeroRankEmptyAndMetadata) {
  const std::string path = p("z.safetensors");
  save_safetensors(path,
                   {{"scalar", at::scalar_tensor(3.5, at::kFloat)},
                    {"empty", at::empty({0, 4}, at::kBFloat16)},
                    {"empty1d", at::empty({0}, at::kLong)},
                    {"after", at::arange(3, at::kInt)}},
                   {{"format", "pt"}, {"step", "42"}});
  SafetensorsFile f(path);
  at::Tensor s = f.tensor("scalar");
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.item<float>(), 3.5f);
  EXPECT_EQ(f.tensor("empty").sizes(), at::IntArrayRef({0, 4}));
  EXPECT_EQ(f.tensor("empty").scalar_type(), at::kBFloat16);
  EXPECT_EQ(f.tensor("empty1d").numel(), 0);
  EXPECT_TRUE(at::equal(f.tensor("after"), at::arange(3, at::kInt)));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("step"), "42");
  EXPECT_EQ(f.metadata().size(), 2u);
}

TEST_F(SafetensorsTest, HeaderPaddedAndOffsetsInInsertionOrder) {
  const std::string path = p("o.safetensors");
  save_safetensors(path, {{"zz", at::ones({3}, at::kByte)}, {"aa", at::ones({2}, at::kFloat)}});
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
  std::string h(n, '\0');
  in.read(&h[0], n);
  EXPECT_EQ(h.front(), '{');
  EXPECT_LT(h.find("\"zz\""), h.find("\"aa\""));
  SafetensorsFile f(path);
  EXPECT_EQ(f.info("zz").begin, 0u);
  EXPECT_EQ(f.info("zz").end, 3u);
  EXPECT_EQ(f.info("aa").begin, 3u);  // misaligned F32: tensor() must still work
  EXPECT_TRUE(at::equal(f.tensor("aa"), at::ones({2})));
  EXPECT_EQ(size_of(path), 8 + n + 11);
}

TEST_F(SafetensorsTest, OverwriteIsAtomicRename) {
  const std::string path = p("a.safetensors");
  save_safetensors(path, {{"x", at::zeros({4})}});
  SafetensorsFile old(path);
  at::Tensor old_x = old.tensor("x");
  save_safetensors(path, {{"x", at::ones({4})}});
  EXPECT_TRUE(at::equal(old_x, at::zeros({4})));  // old mapping still sees the old inode
  EXPECT_TRUE(at::equal(SafetensorsFile(path).tensor("x"), at::ones({4})));
  EXPECT_FALSE(path_exists(path + ".tmp"));
}

TEST_F(SafetensorsTest, TensorKeepsMappingAlive) {
  const std::string path = p("k.safetensors");
  save_safetensors(path, {{"w", at::arange(1000, at::kFloat)}});
  at::Tensor t;
  {
    SafetensorsFile f(path);
    t = f.tensor("w");
  }
  EXPECT_TRUE(at::equal(t, at::arange(1000, at::kFloat)));
}

TEST_F(SafetensorsTest, SaveRejectsDuplicatesAndUnsupported) {
  expect_error([&] { save_safetensors(p("d.safetensors"), {{"a", at::ones({1})}, {"a", at::ones({1})}}); },
               {p("d.safetensors"), "'a'", "duplicate"});
  expect_error([&] { save_safetensors(p("c.safetensors"), {{"c", at::ones({1}, at::kComplexFloat)}}); },
               {p("c.safetensors"), "'c'", "unsupported dtype"});
  EXPECT_FALSE(path_exists(p("d.safetensors")));
  EXPECT_FALSE(path_exists(p("d.safetensors.tmp")));
}

// ---------------------------------------------------------------------------------------------------------------
// Files written by Python safetensors

TEST(SafetensorsPython, ReadsAllDtypesFixture) {
  const std::string path = fixtures_dir() + "/all_dtypes.safetensors";
  SafetensorsFile f(path);
  EXPECT_EQ(f.names().size(), 12u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "gmod fixture");
  EXPECT_TRUE(at::equal(f.tensor("bool"), at::tensor({1, 0, 1, 1, 0}, at::kInt).to(at::kBool)));
  EXPECT_TRUE(at::equal(f.tensor("u8"), (at::arange(6, at::kByte) * 40).reshape({2, 3})));
  EXPECT_TRUE(at::equal(f.tensor("i8"), at::arange(-3, 3, at::kChar).reshape({3, 2})));
  EXPECT_TRUE(at::equal(f.tensor("i16"), at::arange(-4, 4, at::kShort) * 1000));
  EXPECT_TRUE(at::equal(f.tensor("i32"), (at::arange(-5, 7, at::kInt) * 100000).reshape({2, 2, 3})));
  const int64_t big = int64_t(1) << 62;
  EXPECT_TRUE(at::equal(f.tensor("i64"), at::tensor(std::vector<int64_t>{-big, -1, 0, 1, big}, at::kLong)));
  EXPECT_TRUE(at::equal(f.tensor("f16"), (at::arange(6, at::kFloat).reshape({3, 2}) * 0.25 - 0.5).to(at::kHalf)));
  EXPECT_TRUE(at::equal(f.tensor("f32"), at::arange(12, at::kFloat).reshape({3, 4}) / 8 - 0.75));
  EXPECT_TRUE(at::allclose(f.tensor("f64"), at::arange(4, at::kDouble) / 3, 0, 0));
  at::Tensor bf = f.tensor("bf16");
  ASSERT_EQ(bf.scalar_type(), at::kBFloat16);
  ASSERT_EQ(bf.sizes(), at::IntArrayRef({2, 4}));
  const uint16_t want[] = {0x3F80, 0xC020, 0x7F80, 0x0001, 0x7FC0, 0x8000, 0x4049, 0x477F};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(bits16(bf, i), want[i]) << i;
  EXPECT_EQ(f.tensor("scalar").dim(), 0);
  EXPECT_EQ(f.tensor("scalar").item<float>(), 2.5f);
  EXPECT_EQ(f.tensor("empty").sizes(), at::IntArrayRef({0, 3}));
}

TEST(SafetensorsPython, ReadsShardedCheckpoint) {
  const std::string dir = fixtures_dir() + "/sharded";
  for (const std::string& open : {dir, dir + "/model.safetensors.index.json"}) {
    SCOPED_TRACE(open);
    SafetensorsCheckpoint ck(open);
    EXPECT_EQ(ck.names(), (std::vector<std::string>{"lm_head.weight", "model.embed_tokens.weight",
                                                    "model.layers.0.input_layernorm.weight", "model.norm.weight"}));
    EXPECT_EQ(ck.files().size(), 2u);
    EXPECT_NE(ck.file_of("lm_head.weight").find("model-00002-of-00002.safetensors"), std::string::npos);
    EXPECT_NE(ck.file_of("model.embed_tokens.weight").find("model-00001-of-00002.safetensors"), std::string::npos);
    at::Tensor e = ck.tensor("model.embed_tokens.weight");
    EXPECT_TRUE(at::equal(e, (at::arange(32, at::kFloat).reshape({8, 4}) / 4).to(at::kBFloat16)));
    EXPECT_TRUE(at::equal(ck.tensor("model.norm.weight"), at::full({4}, 0.5, at::kBFloat16)));
    EXPECT_EQ(ck.scalar_type("lm_head.weight"), at::kBFloat16);
    EXPECT_EQ(ck.metadata().at("format"), "pt");
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Checkpoints written by us

TEST_F(SafetensorsTest, ShardedWriterRoundTrip) {
  std::vector<std::pair<std::string, at::Tensor>> ts;
  for (int i = 0; i < 5; ++i) ts.emplace_back("w" + std::to_string(i), at::full({10}, float(i)));  // 40 B each
  ts.emplace_back("big", at::arange(100, at::kFloat));  // 400 B > max: own shard
  auto shards = save_safetensors_sharded(p("ck"), ts, 100, {{"format", "pt"}});
  EXPECT_EQ(shards, (std::vector<std::string>{"model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                                              "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors"}));
  std::ifstream in(p("ck/model.safetensors.index.json"));
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_NE(ss.str().find("\"total_size\": 600"), std::string::npos) << ss.str();
  SafetensorsCheckpoint ck(p("ck"));
  EXPECT_EQ(ck.names().size(), 6u);
  for (const auto& [name, t] : ts) EXPECT_TRUE(at::equal(ck.tensor(name), t)) << name;
  EXPECT_NE(ck.file_of("big").find("model-00004-of-00004"), std::string::npos);
  EXPECT_NE(ck.file_of("w2").find("model-00002-of-00004"), std::string::npos);
  EXPECT_EQ(SafetensorsFile(p("ck/model-00001-of-00004.safetensors")).metadata().at("format"), "pt");
}

TEST_F(SafetensorsTest, CheckpointSingleFileAndLooseFiles) {
  mkdirs(p("one"));
  save_safetensors(p("one/model.safetensors"), {{"a", at::ones({2})}});
  save_safetensors(p("one/other.safetensors"), {{"ignored", at::ones({2})}});  // model.safetensors wins
  SafetensorsCheckpoint one(p("one"));
  EXPECT_EQ(one.names(), std::vector<std::string>{"a"});

  mkdirs(p("loose"));
  save_safetensors(p("loose/x.safetensors"), {{"a", at::ones({2})}});
  save_safetensors(p("loose/y.safetensors"), {{"b", at::zeros({2})}});
  SafetensorsCheckpoint loose(p("loose"));
  EXPECT_EQ(loose.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_NE(loose.file_of("b").find("y.safetensors"), std::string::npos);

  SafetensorsCheckpoint file(p("loose/y.safetensors"));
  EXPECT_EQ(file.names(), std::vector<std::string>{"b"});

  save_safetensors(p("loose/z.safetensors"), {{"b", at::zeros({2})}});
  expect_error([&] { SafetensorsCheckpoint c(p("loose")); }, {"'b'", "y.safetensors", "z.safetensors"});

  mkdirs(p("none"));
  expect_error([&] { SafetensorsCheckpoint c(p("none")); }, {p("none")});
  expect_error([&] { SafetensorsCheckpoint c(p("nope")); }, {p("nope"), "no such"});
}

// ---------------------------------------------------------------------------------------------------------------
// Malformed input: one test per case; the message names the file and, where there is one, the tensor.

TEST_F(SafetensorsTest, BadFileShorterThan8Bytes) {
  const std::string path = write_bytes("short.safetensors", std::string("\x05\x00\x00", 3));
  expect_error([&] { SafetensorsFile f(path); }, {path, "shorter than the 8-byte"});
  const std::string empty = write_bytes("empty.safetensors", "");
  expect_error([&] { SafetensorsFile f(empty); }, {empty, "0 bytes"});
}

TEST_F(SafetensorsTest, BadBufferShorterThanOffsets) {
  // Header promises 16 bytes, the file was cut after 10.
  const std::string path =
      write_raw("trunc.safetensors", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 10);
  expect_error([&] { SafetensorsFile f(path); }, {path, "'w'", "out of range", "10 bytes"});
}

TEST_F(SafetensorsTest, BadHeaderLengthBeyondFile) {
  const std::string path = write_raw("hlen.safetensors", R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
                                     1, /*len_override=*/5000);
  expect_error([&] { SafetensorsFile f(path); }, {path, "header length 5000", "beyond the end"});
  const std::string huge = write_raw("huge.safetensors", "{}", 0, int64_t(1) << 40);
  expect_error([&] { SafetensorsFile f(huge); }, {huge, "exceeds the limit"});
}

TEST_F(SafetensorsTest, BadMalformedJson) {
  const std::string path = write_raw("json.safetensors", R"({"w":{"dtype":"F32","shape":[1],)", 4);
  expect_error([&] { SafetensorsFile f(path); }, {path, "malformed header JSON"});
  const std::string nobrace = write_raw("nobrace.safetensors", R"(["w"])", 0);
  expect_error([&] { SafetensorsFile f(nobrace); }, {nobrace, "'{'"});
  const std::string dup = write_raw(
      "dup.safetensors",
      R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
      2);
  expect_error([&] { SafetensorsFile f(dup); }, {dup, "'w'", "duplicate"});
  const std::string neg =
      write_raw("neg.safetensors", R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", 1);
  expect_error([&] { SafetensorsFile f(neg); }, {neg, "'w'", "negative"});
}

TEST_F(SafetensorsTest, HeaderSpacePaddingAccepted) {
  const std::string path =
      write_raw("pad.safetensors", std::string(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})") + "     ", 2);
  SafetensorsFile f(path);
  EXPECT_EQ(f.tensor("w").sum().item<int64_t>(), 2);
}

TEST_F(SafetensorsTest, BadOverlappingOffsets) {
  const std::string path = write_raw(
      "overlap.safetensors",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      12);
  expect_error([&] { SafetensorsFile f(path); }, {path, "'b'", "overlap", "'a'"});
}

TEST_F(SafetensorsTest, BadOutOfRangeOffsets) {
  const std::string path = write_raw(
      "range.safetensors",
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,1000]}})",
      16);
  expect_error([&] { SafetensorsFile f(path); }, {path, "'b'", "[8, 1000]", "out of range"});
  const std::string rev =
      write_raw("rev.safetensors", R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4);
  expect_error([&] { SafetensorsFile f(rev); }, {rev, "'a'", "begin > end"});
}

TEST_F(SafetensorsTest, BadOffsetsInconsistentWithShape) {
  const std::string path =
      write_raw("shape.safetensors", R"({"w":{"dtype":"BF16","shape":[3,2],"data_offsets":[0,8]}})", 8);
  expect_error([&] { SafetensorsFile f(path); }, {path, "'w'", "span 8 bytes", "needs 12"});
}

TEST_F(SafetensorsTest, BadHoleAndTrailingBytes) {
  const std::string hole = write_raw(
      "hole.safetensors",
      R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}})",
      12);
  expect_error([&] { SafetensorsFile f(hole); }, {hole, "'b'", "MetadataIncompleteBuffer", "[4, 8)"});
  const std::string trail =
      write_raw("trail.safetensors", R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 9);
  expect_error([&] { SafetensorsFile f(trail); }, {trail, "MetadataIncompleteBuffer", "trailing"});
}

TEST_F(SafetensorsTest, BadUnknownDtype) {
  const std::string path =
      write_raw("dtype.safetensors", R"({"w":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,2]}})", 2);
  expect_error([&] { SafetensorsFile f(path); }, {path, "'w'", "unsupported dtype Q4_K"});
  // A dtype of the format that gmod does not load: the file opens, tensor() refuses.
  const std::string u16 = write_raw(
      "u16.safetensors",
      R"({"u":{"dtype":"U16","shape":[2],"data_offsets":[0,4]},"f":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[4,6]}})",
      6);
  SafetensorsFile f(u16);
  EXPECT_EQ(f.info("u").nbytes(), 4u);
  expect_error([&] { f.tensor("u"); }, {u16, "'u'", "unsupported dtype U16"});
  expect_error([&] { f.tensor("f"); }, {u16, "'f'", "unsupported dtype F8_E4M3"});
}

TEST_F(SafetensorsTest, BadMissingTensorRequested) {
  const std::string path = p("m.safetensors");
  save_safetensors(path, {{"present", at::ones({1})}});
  SafetensorsFile f(path);
  EXPECT_FALSE(f.has("absent"));
  expect_error([&] { f.tensor("absent"); }, {path, "'absent'", "no such tensor"});
  SafetensorsCheckpoint ck(path);
  expect_error([&] { ck.tensor("absent"); }, {path, "'absent'", "no such tensor"});
  expect_error([&] { ck.file_of("absent"); }, {path, "'absent'"});
}

TEST_F(SafetensorsTest, BadIndexPointsAtMissingShard) {
  mkdirs(p("ck"));
  save_safetensors(p("ck/model-00001-of-00002.safetensors"), {{"a", at::ones({1})}});
  write_bytes("ck/model.safetensors.index.json",
              R"({"metadata":{"total_size":8},"weight_map":{"a":"model-00001-of-00002.safetensors",)"
              R"("b":"model-00002-of-00002.safetensors"}})");
  expect_error([&] { SafetensorsCheckpoint c(p("ck")); },
               {p("ck/model.safetensors.index.json"), "'b'", "model-00002-of-00002.safetensors", "does not exist"});
}

TEST_F(SafetensorsTest, BadIndexShardLacksTensor) {
  mkdirs(p("ck"));
  save_safetensors(p("ck/model-00001-of-00001.safetensors"), {{"a", at::ones({1})}});
  write_bytes("ck/model.safetensors.index.json",
              R"({"weight_map":{"a":"model-00001-of-00001.safetensors","c":"model-00001-of-00001.safetensors"}})");
  expect_error([&] { SafetensorsCheckpoint c(p("ck")); },
               {p("ck/model.safetensors.index.json"), "'c'", "model-00001-of-00001.safetensors", "no such tensor"});
}

TEST_F(SafetensorsTest, BadShardInCheckpointNamesShard) {
  mkdirs(p("ck"));
  write_raw("ck/model-00001-of-00001.safetensors", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4);
  write_bytes("ck/model.safetensors.index.json", R"({"weight_map":{"a":"model-00001-of-00001.safetensors"}})");
  expect_error([&] { SafetensorsCheckpoint c(p("ck")); },
               {p("ck/model-00001-of-00001.safetensors"), "'a'", "out of range"});
}

// ---------------------------------------------------------------------------------------------------------------
// copy_into

TEST(SafetensorsCopyInto, ShapeMismatchNamesTensorFileAndShapes) {
  at::Tensor dst = at::zeros({4, 3});
  at::Tensor src = at::ones({3, 4}, at::kBFloat16);
  expect_error([&] { copy_into(dst, src, "model.norm.weight", "/ck/model.safetensors"); },
               {"/ck/model.safetensors", "'model.norm.weight'", "[4, 3]", "[3, 4]"});
  EXPECT_EQ(dst.sum().item<float>(), 0.f);
}

TEST(SafetensorsCopyInto, ConvertsFloatDtypesIntoParameter) {
  at::Tensor param = at::zeros({2, 3}).set_requires_grad(true);  // leaf parameter: needs no-grad copy
  at::Tensor src = (at::arange(6, at::kFloat).reshape({2, 3}) * 0.5).to(at::kBFloat16);
  copy_into(param, src, "w", "f");
  EXPECT_TRUE(at::equal(param.detach(), at::arange(6, at::kFloat).reshape({2, 3}) * 0.5));
  EXPECT_TRUE(param.requires_grad());
  at::Tensor half = at::zeros({2, 3}, at::kHalf);
  copy_into(half, src, "w", "f");
  EXPECT_TRUE(at::equal(half.to(at::kFloat), param.detach()));
  at::Tensor bf = at::zeros({2, 3}, at::kBFloat16);
  copy_into(bf, at::arange(6, at::kFloat).reshape({2, 3}), "w", "f");
  EXPECT_TRUE(at::equal(bf, at::arange(6, at::kFloat).reshape({2, 3}).to(at::kBFloat16)));
  at::Tensor ints = at::zeros({2, 3}, at::kLong);
  expect_error([&] { copy_into(ints, src, "w", "file.safetensors"); }, {"file.safetensors", "'w'", "dtype"});
}

// ---------------------------------------------------------------------------------------------------------------
// Opening maps the file instead of reading it: a 200 MB (sparse) file costs far less than 200 MB of RSS.

TEST_F(SafetensorsTest, OpenDoesNotReadWholeFile) {
  const uint64_t nbytes = 200ull << 20;
  const std::string header = R"({"big":{"dtype":"U8","shape":[)" + std::to_string(nbytes) +
                             R"(],"data_offsets":[0,)" + std::to_string(nbytes) + "]}}";
  const std::string path = write_raw("big.safetensors", header, 0);
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(8 + header.size() + nbytes)), 0);
  const long before = vm_rss_kb();
  ASSERT_GT(before, 0);
  SafetensorsFile f(path);
  at::Tensor t = f.tensor("big");
  EXPECT_EQ(t.numel(), static_cast<int64_t>(nbytes));
  EXPECT_EQ(t[12345].item<uint8_t>(), 0);  // touches one page
  const long after = vm_rss_kb();
  EXPECT_LT(after - before, 20 * 1024) << "RSS grew by " << (after - before) << " kB";
  const auto* base = static_cast<const uint8_t*>(t.data_ptr());
  EXPECT_EQ(base[nbytes - 1], 0);
}

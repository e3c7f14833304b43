// The TensorBoard event writer's pieces: CRC-32C against the catalogue's check value, TensorFlow's record framing
// read back by hand, and the tags a metrics line becomes. The files as a whole are read by TensorBoard's own reader
// in ctest tensorboard_events (tests/trainer/check_tensorboard.py).
#include "trainer/tensorboard_events.h"

#include "tests/common/paths.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

using gmod::TensorBoardWriter;

TEST(TensorBoardEvents, Crc32cMatchesTheCatalogueCheckValue) {
  const char* s = "123456789";  // CRC-32C/ISCSI check value (the CRC RevEng catalogue): 0xE3069283
  EXPECT_EQ(gmod::crc32c(s, std::strlen(s)), 0xE3069283u);
  // Incremental use gives the same value.
  EXPECT_EQ(gmod::crc32c(s + 4, 5, gmod::crc32c(s, 4)), 0xE3069283u);
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(gmod::masked_crc32c(s, std::strlen(s)), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TensorBoardEvents, MetricsLineBecomesSlashTags) {
  const nlohmann::json j = {{"step", 7},         {"loss", 1.5},       {"skipped", true}, {"note", "text"},
                            {"skip_ratio", {{"3", 0.25}}}, {"memory", {{"rss_mb", 100.0}}}, {"ids", {1, 2}}};
  const auto f = TensorBoardWriter::flatten(j);
  std::map<std::string, float> m(f.begin(), f.end());
  EXPECT_EQ(m.size(), 4u);  // step, strings and arrays are left out
  EXPECT_EQ(m.at("loss"), 1.5f);
  EXPECT_EQ(m.at("skipped"), 1.0f);
  EXPECT_EQ(m.at("skip_ratio/3"), 0.25f);
  EXPECT_EQ(m.at("memory/rss_mb"), 100.0f);
  const auto e = TensorBoardWriter::flatten({{"loss", 2.0}, {"step", 3}}, "eval/");
  ASSERT_EQ(e.size(), 2u);  // under a prefix "step" is an ordinary value
}

// Every record: length, masked CRC of the length, data, masked CRC of the data; the records tile the file.
TEST(TensorBoardEvents, RecordsAreFramedWithMaskedCrcs) {
  gmod::test::TempDir dir;
  std::string path;
  {
    TensorBoardWriter w(dir.str() + "/tb", /*resume_step=*/5, nullptr);
    w.scalars(6, {{"loss", 0.5}});
    path = w.path();
  }
  std::ifstream in(path, std::ios::binary);
  const std::string b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t at = 0;
  int records = 0;
  while (at < b.size()) {
    ASSERT_LE(at + 12, b.size());
    uint64_t n;
    uint32_t lc, dc;
    std::memcpy(&n, b.data() + at, 8);
    std::memcpy(&lc, b.data() + at + 8, 4);
    EXPECT_EQ(lc, gmod::masked_crc32c(b.data() + at, 8));
    ASSERT_LE(at + 12 + n + 4, b.size());
    std::memcpy(&dc, b.data() + at + 12 + n, 4);
    EXPECT_EQ(dc, gmod::masked_crc32c(b.data() + at + 12, n));
    if (records == 0) EXPECT_NE(b.substr(at + 12, n).find("brain.Event:2"), std::string::npos);
    at += 12 + n + 4;
    ++records;
  }
  EXPECT_EQ(records, 3);  // file_version, SessionLog START (resumed at 5), the scalars
}

// Checkpoint data written with O_DIRECT (trainer/checkpoint/direct_write.h, H5File::create's direct_data): the bytes
// on disk equal the regions given, whatever their offsets and tails; an HDF5 file built that way reads back
// bitwise with every dataset's CRC verified, and its whole-file CRC from the known regions equals a full read.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <zlib.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "tests/common/paths.h"
#include "trainer/checkpoint/direct_write.h"
#include "trainer/checkpoint/file_crc.h"
#include "trainer/checkpoint/hdf5_file.h"

using namespace gmod;

namespace {
std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
}  // namespace

TEST(DirectWrite, RegionsLandAtTheirOffsetsWithTheirTails) {
  gmod::test::TempDir dir;
  const std::string path = dir.str("f.bin");
  std::vector<char> expect(40u << 20, 'x');
  {
    std::ofstream f(path, std::ios::binary);
    f.write(expect.data(), std::streamsize(expect.size()));
  }
  std::mt19937 rng(7);
  std::vector<std::vector<char>> data;
  std::vector<DirectRegion> regions;
  // Aligned and long (several bounce buffers, a tail), aligned and shorter than a block, unaligned.
  for (auto [off, n] : {std::pair<uint64_t, uint64_t>{4096, (33u << 20) + 123}, {(34u << 20), 1000},
                        {(35u << 20) + 17, (1u << 20) + 5}, {(37u << 20), 8192}}) {
    data.emplace_back(n);
    for (auto& c : data.back()) c = char(rng());
    regions.push_back({off, data.back().data(), n});
    std::copy(data.back().begin(), data.back().end(), expect.begin() + std::ptrdiff_t(off));
  }
  const DirectWriteStats st = write_regions_direct(path, regions);
  EXPECT_EQ(st.direct_bytes + st.buffered_bytes, (33u << 20) + 123 + 1000 + (1u << 20) + 5 + 8192);
  EXPECT_EQ(slurp(path), std::string(expect.begin(), expect.end()));

  BackgroundRegionWriter bg(path);
  std::vector<char> more(5u << 20, 'q');
  bg.add({8192, more.data(), more.size()});
  bg.finish();
  std::copy(more.begin(), more.end(), expect.begin() + 8192);
  EXPECT_EQ(slurp(path), std::string(expect.begin(), expect.end()));
}

TEST(DirectWrite, MissingFileIsNamed) {
  gmod::test::TempDir dir;
  char b[16] = {};
  try {
    write_regions_direct(dir.str("nope.bin"), {{0, b, sizeof b}});
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("nope.bin"), std::string::npos) << e.what();
  }
}

TEST(DirectWrite, Hdf5FileWithDirectDataReadsBackBitwise) {
  gmod::test::TempDir dir;
  const std::string path = dir.str("t.h5");
  at::manual_seed(3);
  const std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"big", at::randn({3, 1000, 117})},                  // ~1.4 MB, deferred, with a tail
      {"small", at::randn({10, 10})},                      // written by HDF5
      {"bf16", at::randn({1 << 19}).to(at::kBFloat16)},    // exactly 1 MiB, deferred
      {"strided", at::randn({700, 800}).t()}};             // non-contiguous source, deferred
  std::vector<KnownCrcRegion> known;
  {
    H5File f = H5File::create(path, /*direct_data=*/true);
    for (const auto& [n, t] : tensors) f.write_tensor(n, t);
    known = f.written_regions();
    f.close();
  }
  uint64_t size = 0;
  bool used = false;
  EXPECT_EQ(crc32_file_with_known(path, known, &size, &used), crc32_file(path));
  EXPECT_TRUE(used);
  H5File f = H5File::open(path);
  for (const auto& [n, t] : tensors) {
    const at::Tensor r = f.read_tensor(n, /*verify=*/true);
    EXPECT_TRUE(at::equal(r, t.contiguous())) << n;
  }
}

// crc32_bytes (ISA-L's kernel) is zlib's CRC-32: the same value as zlib's one pass over a 100 MiB buffer and over
// sizes that end inside its 64- and 16-byte blocks, from 0 and from a CRC to continue from.
TEST(DirectWrite, CrcEqualsZlib) {
  std::vector<unsigned char> buf((100u << 20) + 3);
  std::mt19937 rng(11);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (const uint32_t start : {0u, 0x1234abcdu}) {
    uLong one = start;
    for (size_t off = 0; off < buf.size(); off += 1u << 30)
      one = crc32(one, buf.data() + off, uInt(std::min<size_t>(buf.size() - off, 1u << 30)));
    EXPECT_EQ(crc32_bytes(buf.data(), buf.size(), start), uint32_t(one)) << start;
    for (const size_t n : {size_t(0), size_t(1), size_t(15), size_t(63), size_t(64), size_t(65), size_t(4099)})
      EXPECT_EQ(crc32_bytes(buf.data() + 5, n, start), uint32_t(crc32(start, buf.data() + 5, uInt(n)))) << n;
  }
}

// Checkpoint data written with O_DIRECT (trainer/checkpoint/direct_write.h, H5File::create's direct_data): the bytes
// on disk equal the regions given, whatever their offsets and tails; an HDF5 file built that way reads back
// bitwise with every dataset's CRC verified, and its whole-file CRC from the known regions equals a full read.
// Large datasets are read back in one pass (read_file_region_crc: pread in parallel ranges, CRC taken as read).
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
#include "tests/trainer/checkpoint_fixture.h"
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

// read_file_region_crc: the bytes of any region (an odd offset and length, ranges read in parallel) and the CRC-32
// of one pass over them; a region past the end of the file is an error naming it.
TEST(DirectWrite, RegionReadGivesTheBytesAndTheirCrc) {
  gmod::test::TempDir dir;
  const std::string path = dir.str("r.bin");
  std::vector<unsigned char> data((70u << 20) + 77);
  std::mt19937 rng(5);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
  }
  for (const auto& [off, n] : {std::pair<uint64_t, uint64_t>{13, data.size() - 20}, {4096, 1000}, {0, data.size()}}) {
    std::vector<unsigned char> got(n, 0);
    EXPECT_EQ(read_file_region_crc(path, off, n, got.data()), crc32_bytes(data.data() + off, n)) << off << " " << n;
    EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin() + std::ptrdiff_t(off))) << off << " " << n;
  }
  std::vector<unsigned char> got(100);
  try {
    read_file_region_crc(path, data.size() - 50, 100, got.data());
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("r.bin"), std::string::npos) << e.what();
  }
}

// A dataset read in one pass (>= 1 MiB, contiguous, stored as in memory) reads back bitwise, into a new tensor or
// into a given one, and a byte flipped in either half of it (each half read by its own range) fails its CRC, naming
// the dataset: thrown, or collected with a sink (the resume's collective load).
TEST(DirectWrite, LargeDatasetReadInOnePassChecksItsCrc) {
  gmod::test::TempDir dir;
  const std::string path = dir.str("big.h5");
  at::manual_seed(9);
  const at::Tensor big = at::randn({(70 << 20) / 4 + 3});  // ~70 MiB: two ranges
  const at::Tensor half = at::randn({1 << 20}).to(at::kBFloat16);
  {
    H5File f = H5File::create(path);
    f.write_tensor("big", big);
    f.write_tensor("half", half);
    f.close();
  }
  uint64_t off = 0;
  {
    const H5File f = H5File::open(path);
    EXPECT_TRUE(bit_equal(f.read_tensor("big"), big));
    EXPECT_TRUE(bit_equal(f.read_tensor("half"), half));
    at::Tensor into = at::empty_like(big);
    f.read_tensor_into("big", into);
    EXPECT_TRUE(bit_equal(into, big));
    const auto regions = f.checksummed_regions(1u << 20);
    for (const auto& r : regions)
      if (r.bytes == uint64_t(big.numel()) * 4) off = r.offset;
  }
  ASSERT_GT(off, 0u);
  for (const uint64_t at_byte : {uint64_t(1000), uint64_t(big.numel()) * 4 - 1000}) {
    flip_byte(path, off + at_byte);
    {
      const H5File f = H5File::open(path);
      try {
        f.read_tensor("big");
        ADD_FAILURE() << "no throw for the byte at " << at_byte;
      } catch (const Hdf5Error& e) {
        EXPECT_NE(std::string(e.what()).find("checksum mismatch for dataset 'big'"), std::string::npos) << e.what();
      }
      std::vector<std::string> sink;
      H5File g = H5File::open(path);
      g.set_crc_failures(&sink);
      EXPECT_FALSE(bit_equal(g.read_tensor("big"), big));
      EXPECT_EQ(sink.size(), 1u) << at_byte;
    }
    flip_byte(path, off + at_byte);  // back
  }
  EXPECT_TRUE(bit_equal(H5File::open(path).read_tensor("big"), big));
}

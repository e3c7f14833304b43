// Image decoding and CLIP preprocessing against PIL / transformers fixtures
// (tests/fixtures/make_image_fixtures.py -> tests/fixtures/image/).
#include <ftw.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/clip_preprocess.h"
#include "data/image.h"

namespace fs = std::filesystem;
using gmod::Image;

// A named namespace around the file keeps its helpers apart from other files in a unity build.
namespace test_image {
namespace {

fs::path fixture_dir() {
  if (const char* root = std::getenv("GMOD_SOURCE_DIR")) return fs::path(root) / "tests/fixtures/image";
  return fs::path(__FILE__).parent_path().parent_path() / "fixtures/image";
}

std::vector<char> read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open fixture " << p;
  return std::vector<char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

template <typename T>
std::vector<T> read_raw(const fs::path& p, size_t count) {
  const auto bytes = read_bytes(p);
  EXPECT_EQ(bytes.size(), count * sizeof(T)) << p;
  std::vector<T> out(count);
  std::memcpy(out.data(), bytes.data(), std::min(bytes.size(), count * sizeof(T)));
  return out;
}

nlohmann::json manifest() {
  std::ifstream f(fixture_dir() / "manifest.json");
  EXPECT_TRUE(f.good()) << "missing " << fixture_dir() / "manifest.json"
                        << " (run tests/fixtures/make_image_fixtures.py)";
  nlohmann::json j;
  f >> j;
  return j;
}

Image pil_rgb(const nlohmann::json& entry) {
  Image im;
  im.width = entry["width"];
  im.height = entry["height"];
  im.rgb = read_raw<uint8_t>(fixture_dir() / entry["rgb"].get<std::string>(), size_t(im.width) * im.height * 3);
  return im;
}

nlohmann::json image_entry(const nlohmann::json& m, const std::string& file) {
  for (const auto& e : m["images"])
    if (e["file"] == file) return e;
  ADD_FAILURE() << "no manifest entry for " << file;
  return {};
}

// std::filesystem::remove_all is unusable in binaries linking libtorch.so: libtorch exports its own
// std::filesystem symbols and its remove_all crashes (null call). Remove trees with nftw instead.
void remove_tree(const fs::path& d) {
  ::nftw(d.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
         FTW_DEPTH | FTW_PHYS);
}

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() / ("gmod_test_image_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

void write_bytes(const fs::path& p, const std::vector<char>& b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(b.data(), static_cast<std::streamsize>(b.size()));
}

// Expects decode_image_file to throw a runtime_error whose message names the path.
void expect_decode_throws(const fs::path& p, const std::string& reason_fragment) {
  try {
    gmod::decode_image_file(p.string());
    ADD_FAILURE() << "no exception for " << p;
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(p.string()), std::string::npos) << "message lacks the path: " << msg;
    EXPECT_NE(msg.find(reason_fragment), std::string::npos) << "message lacks '" << reason_fragment << "': " << msg;
    std::printf("[ info ] %s\n", msg.c_str());
  }
}

}  // namespace

TEST(Image, DecodeMatchesPil) {
  const auto m = manifest();
  ASSERT_GE(m["images"].size(), 10u);
  for (const auto& e : m["images"]) {
    const std::string file = e["file"];
    SCOPED_TRACE(file);
    const Image want = pil_rgb(e);
    const Image got = gmod::decode_image_file((fixture_dir() / file).string());
    ASSERT_EQ(got.width, want.width);
    ASSERT_EQ(got.height, want.height);
    ASSERT_EQ(got.rgb.size(), want.rgb.size());
    int max_diff = 0;
    for (size_t i = 0; i < got.rgb.size(); ++i) max_diff = std::max(max_diff, std::abs(int(got.rgb[i]) - int(want.rgb[i])));
    std::printf("[ info ] %-15s %-5s %3dx%-3d max |C++ - PIL| = %d\n", file.c_str(), e["mode"].get<std::string>().c_str(),
                got.width, got.height, max_diff);
    // PNG is lossless: exact. JPEG: Debian libjpeg-turbo 2.1 and Pillow's bundled libjpeg-turbo decode
    // these fixtures identically (ISLOW IDCT, fancy upsampling); other libjpeg builds may differ by <= 2.
    if (e["format"] == "png") EXPECT_EQ(max_diff, 0);
    else EXPECT_EQ(max_diff, 0) << "JPEG decode differs from PIL (tolerable up to 2 with another libjpeg)";
  }
}

TEST(Image, ResizeBicubicMatchesPilExactly) {
  const auto m = manifest();
  gmod::ClipPreprocessConfig cfg;
  for (const auto& c : m["clip"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    Image src = pil_rgb(image_entry(m, c["image"]));
    if (c["pad_to_square"].get<bool>()) src = gmod::expand_to_square(src, gmod::pad_color(cfg));
    const int h = c["resized_shape"][0], w = c["resized_shape"][1];
    const auto hw = gmod::shortest_edge_size(src.height, src.width, c["size"].get<int>());
    EXPECT_EQ(hw[0], h);
    EXPECT_EQ(hw[1], w);
    const Image got = gmod::resize_bicubic(src, w, h);
    const auto want = read_raw<uint8_t>(fixture_dir() / c["resized"].get<std::string>(), size_t(w) * h * 3);
    ASSERT_EQ(got.rgb.size(), want.size());
    int max_diff = 0;
    for (size_t i = 0; i < want.size(); ++i) max_diff = std::max(max_diff, std::abs(int(got.rgb[i]) - int(want[i])));
    EXPECT_EQ(max_diff, 0) << src.width << "x" << src.height << " -> " << w << "x" << h;
  }
}

TEST(Image, ClipPreprocessMatchesTransformers) {
  const auto m = manifest();
  double sum_pil = 0, sum_dec = 0, max_pil = 0, max_dec = 0;
  size_t n = 0;
  for (const auto& c : m["clip"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    gmod::ClipPreprocessConfig cfg;
    cfg.size = c["size"];
    cfg.crop = c["crop"];
    cfg.pad_to_square = c["pad_to_square"];
    const size_t count = size_t(3) * cfg.crop * cfg.crop;
    const auto want = read_raw<float>(fixture_dir() / c["clip"].get<std::string>(), count);
    // From PIL's decoded pixels (isolates the preprocessing) and end to end from our decoder.
    const auto from_pil = gmod::clip_preprocess(pil_rgb(image_entry(m, c["image"])), cfg);
    const auto from_dec =
        gmod::clip_preprocess(gmod::decode_image_file((fixture_dir() / c["image"].get<std::string>()).string()), cfg);
    ASSERT_EQ(from_pil.size(), count);
    ASSERT_EQ(from_dec.size(), count);
    double s1 = 0, s2 = 0, m1 = 0, m2 = 0;
    for (size_t i = 0; i < count; ++i) {
      const double d1 = std::fabs(double(from_pil[i]) - want[i]), d2 = std::fabs(double(from_dec[i]) - want[i]);
      s1 += d1;
      s2 += d2;
      m1 = std::max(m1, d1);
      m2 = std::max(m2, d2);
    }
    std::printf("[ info ] %-22s mean|diff| %.3g (max %.3g) from PIL pixels, %.3g (max %.3g) end to end\n",
                name.c_str(), s1 / count, m1, s2 / count, m2);
    EXPECT_LE(s1 / count, 1e-2);
    EXPECT_LE(s2 / count, 1e-2);
    sum_pil += s1;
    sum_dec += s2;
    max_pil = std::max(max_pil, m1);
    max_dec = std::max(max_dec, m2);
    n += count;
  }
  std::printf("[ info ] CLIP preprocess vs CLIPImageProcessor over %zu values: mean|diff| %.3g (max %.3g) from PIL "
              "pixels, %.3g (max %.3g) end to end\n",
              n, sum_pil / n, max_pil, sum_dec / n, max_dec);
  EXPECT_LE(sum_pil / n, 1e-2);
  EXPECT_LE(sum_dec / n, 1e-2);
  // The resize is bit-exact, so only float rounding should remain.
  EXPECT_LE(max_pil, 1e-5);
}

TEST(Image, PadColorAndExpandToSquare) {
  gmod::ClipPreprocessConfig cfg;
  const auto bg = gmod::pad_color(cfg);
  EXPECT_EQ(bg[0], 122);
  EXPECT_EQ(bg[1], 116);
  EXPECT_EQ(bg[2], 104);
  Image land{5, 2, std::vector<uint8_t>(5 * 2 * 3, 7)};
  const Image sq = gmod::expand_to_square(land, bg);
  ASSERT_EQ(sq.width, 5);
  ASSERT_EQ(sq.height, 5);
  for (int y = 0; y < 5; ++y)  // rows (5-2)//2 = 1 and 2 hold the image
    EXPECT_EQ(sq.pixel(2, y)[0], (y == 1 || y == 2) ? 7 : 122) << y;
  Image port{2, 5, std::vector<uint8_t>(2 * 5 * 3, 9)};
  const Image sq2 = gmod::expand_to_square(port, bg);
  for (int x = 0; x < 5; ++x) EXPECT_EQ(sq2.pixel(x, 0)[2], (x == 1 || x == 2) ? 9 : 104) << x;
}

TEST(Image, LoadPreprocessConfig) {
  const auto cfg = gmod::load_preprocess_config((fixture_dir() / "preprocessor_config.json").string());
  EXPECT_EQ(cfg.size, 24);
  EXPECT_EQ(cfg.crop, 24);
  EXPECT_FLOAT_EQ(cfg.mean[0], 0.48145466f);
  EXPECT_FLOAT_EQ(cfg.std[2], 0.27577711f);
  EXPECT_TRUE(cfg.pad_to_square);
  // Directory form and the old integer form of crop_size / size.
  EXPECT_EQ(gmod::load_preprocess_config(fixture_dir().string()).crop, 24);
  const fs::path d = temp_dir();
  {
    std::ofstream f(d / "preprocessor_config.json");
    f << R"({"crop_size": 336, "size": 336, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]})";
  }
  const auto c2 = gmod::load_preprocess_config(d.string());
  EXPECT_EQ(c2.crop, 336);
  EXPECT_EQ(c2.size, 336);
  EXPECT_EQ(c2.mean[1], 0.5f);
  {
    std::ofstream f(d / "bad.json");
    f << R"({"crop_size": {"height": 336, "width": 224}})";
  }
  EXPECT_THROW(gmod::load_preprocess_config((d / "bad.json").string()), std::runtime_error);
  EXPECT_THROW(gmod::load_preprocess_config((d / "missing.json").string()), std::runtime_error);
  remove_tree(d);
}

TEST(Image, CorruptTruncatedAndUnknownFilesThrowWithPath) {
  const fs::path d = temp_dir();
  const auto jpg = read_bytes(fixture_dir() / "land.jpg");
  const auto png = read_bytes(fixture_dir() / "big.png");

  expect_decode_throws(d / "does_not_exist.png", "cannot open");
  write_bytes(d / "empty.jpg", {});
  expect_decode_throws(d / "empty.jpg", "empty");
  const std::string text = "{\"not\": \"an image\"}\n";
  write_bytes(d / "text.png", std::vector<char>(text.begin(), text.end()));
  expect_decode_throws(d / "text.png", "unknown image format");

  write_bytes(d / "trunc.jpg", std::vector<char>(jpg.begin(), jpg.begin() + jpg.size() / 2));
  expect_decode_throws(d / "trunc.jpg", "JPEG");
  write_bytes(d / "header_only.jpg", std::vector<char>(jpg.begin(), jpg.begin() + 20));
  expect_decode_throws(d / "header_only.jpg", "JPEG");
  auto bad_jpg = jpg;  // destroy the frame header and everything after it
  for (size_t i = 4; i < bad_jpg.size(); ++i) bad_jpg[i] = char(0x5A);
  write_bytes(d / "garbled.jpg", bad_jpg);
  expect_decode_throws(d / "garbled.jpg", "JPEG");

  write_bytes(d / "trunc.png", std::vector<char>(png.begin(), png.begin() + png.size() / 2));
  expect_decode_throws(d / "trunc.png", "truncated");
  write_bytes(d / "sig_only.png", std::vector<char>(png.begin(), png.begin() + 8));
  expect_decode_throws(d / "sig_only.png", "PNG");
  auto bad_png = png;  // flip a byte inside IDAT: CRC error
  bad_png[bad_png.size() / 2] ^= 0x40;
  write_bytes(d / "crc.png", bad_png);
  expect_decode_throws(d / "crc.png", "PNG");
  remove_tree(d);
}

TEST(Image, WritePngRoundTrip) {
  Image im{13, 7, {}};
  im.rgb.resize(13 * 7 * 3);
  for (size_t i = 0; i < im.rgb.size(); ++i) im.rgb[i] = uint8_t(i * 37 + 11);
  const fs::path d = temp_dir();
  gmod::write_png((d / "rt.png").string(), im);
  const Image back = gmod::decode_image_file((d / "rt.png").string());
  EXPECT_EQ(back.width, 13);
  EXPECT_EQ(back.height, 7);
  EXPECT_EQ(back.rgb, im.rgb);
  Image bad{4, 4, std::vector<uint8_t>(5)};
  EXPECT_THROW(gmod::write_png((d / "bad.png").string(), bad), std::runtime_error);
  remove_tree(d);
}

namespace {

uint32_t crc32_of(const char* p, size_t n) {  // PNG's CRC-32 (ISO 3309), bitwise
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= uint8_t(p[i]);
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return c ^ 0xFFFFFFFFu;
}

void put_be32(std::vector<char>& b, size_t at, uint32_t v) {
  for (int k = 0; k < 4; ++k) b[at + size_t(k)] = char((v >> (24 - 8 * k)) & 0xFF);
}

std::string decode_error(const fs::path& p, int64_t max_pixels) {
  try {
    gmod::decode_image_file(p.string(), max_pixels);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// A small file whose header claims a huge image (the issue's 20000 x 20000 PNG) is refused from the header, before
// a pixel buffer is allocated; the limit is exact at the fixture's own size; a file too large for any image within
// the limit is refused from its size.
TEST(Image, PixelLimitIsCheckedFromTheHeaderBeforeDecoding) {
  const fs::path d = temp_dir();
  auto png = read_bytes(fixture_dir() / "big.png");  // 100 x 60; IHDR data at bytes 16..28, its CRC at 29..32
  ASSERT_EQ(std::string(png.data() + 12, 4), "IHDR");
  put_be32(png, 16, 20000);
  put_be32(png, 20, 20000);
  put_be32(png, 29, crc32_of(png.data() + 12, 17));
  write_bytes(d / "huge.png", png);
  std::string e = decode_error(d / "huge.png", gmod::kDefaultMaxImagePixels);
  EXPECT_NE(e.find("huge.png"), std::string::npos) << e;
  EXPECT_NE(e.find("20000x20000 = 400000000 pixels, more than the decoded-pixel limit of 67108864"),
            std::string::npos) << e;
  EXPECT_NE(e.find("refused before decoding"), std::string::npos) << e;
  // The header alone is readable without a limit, and probe_image_file applies the limit too.
  const gmod::ImageInfo info = gmod::probe_image_memory(reinterpret_cast<const uint8_t*>(png.data()), png.size(), "x");
  EXPECT_EQ(info.width, 20000);
  EXPECT_EQ(info.height, 20000);
  EXPECT_EQ(info.format, "png");
  EXPECT_THROW(gmod::probe_image_file((d / "huge.png").string()), std::runtime_error);

  // JPEG: land.jpg's baseline frame header (FF C0 at byte 158: length, precision, height, width) says 30000 x 30000.
  auto jpg = read_bytes(fixture_dir() / "land.jpg");
  ASSERT_EQ(uint8_t(jpg[158]), 0xFF);
  ASSERT_EQ(uint8_t(jpg[159]), 0xC0);
  for (size_t at : {size_t(163), size_t(165)}) jpg[at] = char(30000 >> 8), jpg[at + 1] = char(30000 & 0xFF);
  write_bytes(d / "huge.jpg", jpg);
  e = decode_error(d / "huge.jpg", gmod::kDefaultMaxImagePixels);
  EXPECT_NE(e.find("30000x30000 = 900000000 pixels"), std::string::npos) << e;

  // The limit is inclusive: 100 x 60 = 6000 pixels decode with max 6000, not with 5999.
  const fs::path ok = fixture_dir() / "big.png";
  EXPECT_EQ(gmod::decode_image_file(ok.string(), 6000).width, 100);
  EXPECT_NE(decode_error(ok, 5999).find("100x60 = 6000 pixels, more than the decoded-pixel limit of 5999"),
            std::string::npos);
  EXPECT_EQ(gmod::probe_image_file(ok.string(), 6000).height, 60);

  // 8 bytes a pixel + 64 MiB is the most any image within the limit takes on disk; a (sparse) file above it is
  // refused from its size, unread.
  const fs::path big = d / "huge_file.png";
  write_bytes(big, std::vector<char>(png.begin(), png.begin() + 8));
  fs::resize_file(big, (uint64_t(64) << 20) + 8 * 1000 + 1);
  e = decode_error(big, 1000);
  EXPECT_NE(e.find("larger than any image within the decoded-pixel limit of 1000"), std::string::npos) << e;
  remove_tree(d);
}

}  // namespace test_image

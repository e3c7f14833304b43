// JPEG/PNG decoding to RGB (PIL `.convert('RGB')` semantics) and PNG writing. See image.h.
//
// libjpeg and libpng report fatal errors through callbacks that must not return; both are wired to
// longjmp back into the decoding function, which then cleans up and throws. Between setjmp and a
// possible longjmp only objects constructed *before* setjmp live in the decoding frame, so no C++
// destructor is ever skipped.
#include "data/image.h"

#include <sys/stat.h>

#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

// jpeglib.h needs size_t / FILE declared first.
#include <jpeglib.h>
#include <jerror.h>
#include <png.h>

namespace gmod {
namespace {

std::runtime_error image_error(const std::string& name, const std::string& what) {
  return std::runtime_error("image '" + name + "': " + what);
}

// The pixel limit, from header dimensions (max_pixels <= 0: no limit).
void check_pixels(const std::string& name, uint64_t w, uint64_t h, int64_t max_pixels) {
  if (max_pixels > 0 && w * h > uint64_t(max_pixels))
    throw image_error(name, std::to_string(w) + "x" + std::to_string(h) + " = " + std::to_string(w * h) +
                                " pixels, more than the decoded-pixel limit of " + std::to_string(max_pixels) +
                                " (max_image_pixels); refused before decoding");
}

// ---------------------------------------------------------------- JPEG

struct JpegErrorMgr {
  jpeg_error_mgr pub;  // must be first: libjpeg hands us a pointer to it
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_fail(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegErrorMgr*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings are silent, except a premature end of data: libjpeg would pad the image with grey, PIL
// (without LOAD_TRUNCATED_IMAGES) raises "image file is truncated"; we treat it as fatal too.
void jpeg_message(j_common_ptr cinfo, int msg_level) {
  if (msg_level < 0) {
    if (cinfo->err->msg_code == JWRN_JPEG_EOF) jpeg_fail(cinfo);
    cinfo->err->num_warnings++;
  }
}

// PIL's cmyk2rgb on Adobe-inverted ("CMYK;I") samples.
inline uint8_t muldiv255(int a, int b) {
  int t = a * b + 128;
  return static_cast<uint8_t>(((t >> 8) + t) >> 8);
}

// info != nullptr: only reads the header into *info and returns an empty image.
Image decode_jpeg(const uint8_t* data, size_t size, const std::string& name, int64_t max_pixels, ImageInfo* info) {
  jpeg_decompress_struct cinfo;
  JpegErrorMgr err;
  Image img;
  std::vector<uint8_t> row;
  std::memset(&cinfo, 0, sizeof(cinfo));
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = jpeg_fail;
  err.pub.emit_message = jpeg_message;
  err.message[0] = '\0';
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    throw image_error(name, std::string("corrupt or truncated JPEG: ") + err.message);
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, const_cast<unsigned char*>(data), static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  const uint64_t jw = cinfo.image_width, jh = cinfo.image_height;
  if (info) {
    jpeg_destroy_decompress(&cinfo);
    *info = {int(jw), int(jh), "jpeg"};
    return img;
  }
  if (max_pixels > 0 && jw * jh > uint64_t(max_pixels)) {
    jpeg_destroy_decompress(&cinfo);
    check_pixels(name, jw, jh, max_pixels);
  }
  // Same library defaults as PIL: ISLOW IDCT, fancy upsampling, colour space guessed from markers.
  switch (cinfo.num_components) {
    case 1: cinfo.out_color_space = JCS_GRAYSCALE; break;
    case 3: cinfo.out_color_space = JCS_RGB; break;
    case 4: cinfo.out_color_space = JCS_CMYK; break;
    default: cinfo.out_color_space = JCS_RGB; break;  // libjpeg reports the conversion error
  }
  jpeg_start_decompress(&cinfo);
  const int w = static_cast<int>(cinfo.output_width), h = static_cast<int>(cinfo.output_height);
  const int nc = cinfo.output_components;
  img.width = w;
  img.height = h;
  img.rgb.resize(static_cast<size_t>(w) * h * 3);
  row.resize(static_cast<size_t>(w) * nc);
  while (cinfo.output_scanline < cinfo.output_height) {
    const int y = static_cast<int>(cinfo.output_scanline);
    JSAMPROW rows[1] = {row.data()};
    jpeg_read_scanlines(&cinfo, rows, 1);
    uint8_t* out = img.pixel(0, y);
    if (nc == 3) {
      std::memcpy(out, row.data(), static_cast<size_t>(w) * 3);
    } else if (nc == 1) {
      for (int x = 0; x < w; ++x) out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = row[x];
    } else {  // CMYK: PIL reads it as "CMYK;I" (inverted, Adobe convention), then cmyk2rgb
      for (int x = 0; x < w; ++x) {
        const uint8_t* p = &row[4 * x];
        const int nk = p[3];  // 255 - (255 - raw k)
        for (int c = 0; c < 3; ++c) {
          const int v = nk - muldiv255(255 - p[c], nk);
          out[3 * x + c] = static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
        }
      }
    }
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return img;
}

// ---------------------------------------------------------------- PNG

struct PngContext {
  const uint8_t* data = nullptr;
  size_t size = 0;
  size_t pos = 0;
  char message[512] = {0};
};

[[noreturn]] void png_fail(png_structp png, png_const_charp msg) {
  auto* ctx = static_cast<PngContext*>(png_get_error_ptr(png));
  std::snprintf(ctx->message, sizeof(ctx->message), "%s", msg ? msg : "unknown libpng error");
  png_longjmp(png, 1);  // returning would make libpng print the message to stderr before jumping
}

void png_warn(png_structp, png_const_charp) {}

void png_read_mem(png_structp png, png_bytep out, png_size_t n) {
  auto* ctx = static_cast<PngContext*>(png_get_io_ptr(png));
  if (ctx->size - ctx->pos < n) png_error(png, "unexpected end of file (truncated PNG)");
  std::memcpy(out, ctx->data + ctx->pos, n);
  ctx->pos += n;
}

Image decode_png(const uint8_t* data, size_t size, const std::string& name, int64_t max_pixels, ImageInfo* header) {
  PngContext ctx;
  ctx.data = data;
  ctx.size = size;
  Image img;
  std::vector<uint8_t> buf;
  std::vector<png_bytep> rows;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &ctx, png_fail, png_warn);
  if (!png) throw image_error(name, "png_create_read_struct failed");
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    throw image_error(name, "png_create_info_struct failed");
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    throw image_error(name, std::string("corrupt or truncated PNG: ") + ctx.message);
  }
  png_set_read_fn(png, &ctx, png_read_mem);
#ifdef PNG_BENIGN_ERRORS_SUPPORTED
  png_set_benign_errors(png, 1);
#endif
  png_read_info(png, info);
  const uint64_t pw = png_get_image_width(png, info), ph = png_get_image_height(png, info);
  if (header || (max_pixels > 0 && pw * ph > uint64_t(max_pixels))) {
    png_destroy_read_struct(&png, &info, nullptr);
    if (header) {
      *header = {int(pw), int(ph), "png"};
      return img;
    }
    check_pixels(name, pw, ph, max_pixels);
  }
  const int w = static_cast<int>(pw);
  const int h = static_cast<int>(ph);
  const int depth = png_get_bit_depth(png, info);
  const int ctype = png_get_color_type(png, info);
  // PIL opens 16-bit gray as "I;16"; its convert('RGB') saturates at 255 instead of taking the high byte.
  const bool gray16 = (ctype == PNG_COLOR_TYPE_GRAY && depth == 16);
  if (ctype == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (ctype == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (depth == 16 && !gray16) png_set_strip_16(png);  // high byte, like PIL's "RGB;16B" rawmodes
  png_set_strip_alpha(png);                           // convert('RGB') drops alpha without compositing
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const int channels = png_get_channels(png, info);
  const size_t rowbytes = png_get_rowbytes(png, info);
  const int out_depth = png_get_bit_depth(png, info);
  if (!((channels == 1 || channels == 3) && (out_depth == 8 || (gray16 && out_depth == 16))))
    png_error(png, "unsupported pixel layout after expansion");
  buf.resize(rowbytes * h);
  rows.resize(h);
  for (int y = 0; y < h; ++y) rows[y] = buf.data() + rowbytes * y;
  png_read_image(png, rows.data());
  // No png_read_end: like PIL, chunks after the image data (and a missing IEND) are not checked.
  png_destroy_read_struct(&png, &info, nullptr);

  img.width = w;
  img.height = h;
  img.rgb.resize(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    const uint8_t* in = rows[y];
    uint8_t* out = img.pixel(0, y);
    if (channels == 3) {
      std::memcpy(out, in, static_cast<size_t>(w) * 3);
    } else if (gray16) {
      for (int x = 0; x < w; ++x) {
        const int v = (in[2 * x] << 8) | in[2 * x + 1];
        out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = static_cast<uint8_t>(v > 255 ? 255 : v);
      }
    } else {
      for (int x = 0; x < w; ++x) out[3 * x] = out[3 * x + 1] = out[3 * x + 2] = in[x];
    }
  }
  return img;
}

void png_write_mem(png_structp png, png_bytep in, png_size_t n) {
  auto* out = static_cast<std::vector<uint8_t>*>(png_get_io_ptr(png));
  out->insert(out->end(), in, in + n);
}

void png_flush_mem(png_structp) {}

// The format by magic bytes, then a full decode or (header != nullptr) only the header.
Image decode_or_probe(const uint8_t* data, size_t size, const std::string& name, int64_t max_pixels,
                      ImageInfo* header) {
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (size == 0) throw image_error(name, "empty file");
  if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF)
    return decode_jpeg(data, size, name, max_pixels, header);
  if (size >= 8 && std::memcmp(data, kPng, 8) == 0) return decode_png(data, size, name, max_pixels, header);
  throw image_error(name, "unknown image format (expected JPEG or PNG magic bytes)");
}

// The file's bytes. Without reading it, a file that is not a regular file, or larger than any image within
// max_pixels could be (16-bit RGBA stored uncompressed is 8 bytes a pixel; 64 MiB of slack for metadata), is refused.
std::vector<uint8_t> read_image_bytes(const std::string& path, int64_t max_pixels) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw image_error(path, std::string("cannot open file: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw image_error(path, "not a regular file");
  const uint64_t size = uint64_t(st.st_size);
  if (max_pixels > 0 && size > uint64_t(max_pixels) * 8 + (uint64_t(64) << 20))
    throw image_error(path, std::to_string(size) + " bytes, larger than any image within the decoded-pixel limit of " +
                                std::to_string(max_pixels) + " (max_image_pixels) could be");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw image_error(path, "cannot open file");
  std::vector<uint8_t> bytes(size);
  f.read(reinterpret_cast<char*>(bytes.data()), std::streamsize(size));
  if (size_t(f.gcount()) != size) throw image_error(path, "read error (file changed while reading?)");
  return bytes;
}

}  // namespace

ImageInfo probe_image_memory(const uint8_t* data, size_t size, const std::string& name) {
  ImageInfo info;
  decode_or_probe(data, size, name, 0, &info);
  return info;
}

ImageInfo probe_image_file(const std::string& path, int64_t max_pixels) {
  const std::vector<uint8_t> bytes = read_image_bytes(path, max_pixels);
  const ImageInfo info = probe_image_memory(bytes.data(), bytes.size(), path);
  check_pixels(path, uint64_t(info.width), uint64_t(info.height), max_pixels);
  return info;
}

Image decode_image_memory(const uint8_t* data, size_t size, const std::string& name, int64_t max_pixels) {
  return decode_or_probe(data, size, name, max_pixels, nullptr);
}

Image decode_image_file(const std::string& path, int64_t max_pixels) {
  const std::vector<uint8_t> bytes = read_image_bytes(path, max_pixels);
  return decode_image_memory(bytes.data(), bytes.size(), path, max_pixels);
}

void write_png(const std::string& path, const Image& image) {
  if (image.width <= 0 || image.height <= 0 ||
      image.rgb.size() != static_cast<size_t>(image.width) * image.height * 3)
    throw image_error(path, "write_png: rgb buffer does not match " + std::to_string(image.width) + "x" +
                                std::to_string(image.height) + "x3");
  PngContext ctx;
  std::vector<uint8_t> out;
  std::vector<png_bytep> rows(image.height);
  for (int y = 0; y < image.height; ++y)
    rows[y] = const_cast<png_bytep>(image.rgb.data() + static_cast<size_t>(y) * image.width * 3);
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &ctx, png_fail, png_warn);
  if (!png) throw image_error(path, "png_create_write_struct failed");
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_write_struct(&png, nullptr);
    throw image_error(path, "png_create_info_struct failed");
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    throw image_error(path, std::string("PNG encoding failed: ") + ctx.message);
  }
  png_set_write_fn(png, &out, png_write_mem, png_flush_mem);
  png_set_IHDR(png, info, image.width, image.height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  png_write_image(png, rows.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);

  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw image_error(path, "cannot open for writing");
  f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
  if (!f) throw image_error(path, "write failed");
}

}  // namespace gmod

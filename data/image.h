// Image decoding (JPEG via libjpeg-turbo, PNG via libpng) to 8-bit RGB, matching what LLaVA's
// `Image.open(path).convert('RGB')` gives in PIL, plus a small PNG writer. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gmod {

// 8-bit RGB image, row-major HWC: rgb[(y * width + x) * 3 + c]. rgb.size() == width * height * 3.
struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;  // [H, W, 3]

  uint8_t* pixel(int x, int y) { return &rgb[(static_cast<size_t>(y) * width + x) * 3]; }
  const uint8_t* pixel(int x, int y) const { return &rgb[(static_cast<size_t>(y) * width + x) * 3]; }
};

// Decoded-pixel limit (width x height) for images from datasets: 8192 x 8192 = 64 MPixel (192 MiB of RGB), far
// above LLaVA's 336 x 336 inputs and a 4K x 4K photo, far below what a crafted 20000 x 20000 PNG of 1 MB would cost
// (1.2 GB). Configurable: data.max_image_pixels, gmod data check --max-image-pixels.
inline constexpr int64_t kDefaultMaxImagePixels = int64_t(8192) * 8192;

// Dimensions from a JPEG or PNG header (no pixel is decoded).
struct ImageInfo {
  int width = 0;
  int height = 0;
  std::string format;  // "jpeg" or "png"
};

// Reads the header only (PNG IHDR, JPEG up to its frame header). Throws like decode_image_memory.
ImageInfo probe_image_memory(const uint8_t* data, size_t size, const std::string& name);
// Same for a file; also enforces max_pixels (throws naming the file, its size and the limit). The whole file is
// read, as for decoding; a file larger than any image within max_pixels could be is refused without reading it.
ImageInfo probe_image_file(const std::string& path, int64_t max_pixels = kDefaultMaxImagePixels);

// Decodes a JPEG or PNG file (format sniffed from the magic bytes, not the extension) to RGB.
// Conversion follows PIL's `.convert('RGB')`:
//  - alpha (RGBA, LA, palette/gray tRNS) is dropped, not composited;
//  - gray and palette images are expanded; 1/2/4-bit samples are scaled to 0..255;
//  - 16-bit RGB/RGBA/LA keep the high byte; 16-bit gray ("I;16" in PIL) saturates at 255;
//  - JPEG: gray is replicated, CMYK/YCCK converted like PIL (Adobe-inverted CMYK);
//  - no gamma / colour-profile correction and no EXIF rotation (PIL applies neither).
// Throws std::runtime_error naming `path` for a missing, empty, unknown-format, corrupt or truncated file, and for
// an image of more than max_pixels pixels: that is checked from the header, before any pixel buffer is allocated.
Image decode_image_file(const std::string& path, int64_t max_pixels = kDefaultMaxImagePixels);

// Same, from bytes already in memory; `name` is used in error messages.
Image decode_image_memory(const uint8_t* data, size_t size, const std::string& name,
                          int64_t max_pixels = kDefaultMaxImagePixels);

// Writes an 8-bit RGB PNG (no interlace, default zlib level). Throws std::runtime_error on I/O failure.
void write_png(const std::string& path, const Image& image);

}  // namespace gmod

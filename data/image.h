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

// Decodes a JPEG or PNG file (format sniffed from the magic bytes, not the extension) to RGB.
// Conversion follows PIL's `.convert('RGB')`:
//  - alpha (RGBA, LA, palette/gray tRNS) is dropped, not composited;
//  - gray and palette images are expanded; 1/2/4-bit samples are scaled to 0..255;
//  - 16-bit RGB/RGBA/LA keep the high byte; 16-bit gray ("I;16" in PIL) saturates at 255;
//  - JPEG: gray is replicated, CMYK/YCCK converted like PIL (Adobe-inverted CMYK);
//  - no gamma / colour-profile correction and no EXIF rotation (PIL applies neither).
// Throws std::runtime_error naming `path` for a missing, empty, unknown-format, corrupt or truncated file.
Image decode_image_file(const std::string& path);

// Same, from bytes already in memory; `name` is used in error messages.
Image decode_image_memory(const uint8_t* data, size_t size, const std::string& name);

// Writes an 8-bit RGB PNG (no interlace, default zlib level). Throws std::runtime_error on I/O failure.
void write_png(const std::string& path, const Image& image);

}  // namespace gmod

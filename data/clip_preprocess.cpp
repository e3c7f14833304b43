// CLIP / LLaVA "pad" preprocessing with a Pillow-exact bicubic resize. See clip_preprocess.h.
#include "data/clip_preprocess.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

namespace gmod {
namespace {

// Pillow: Resample.c, 8 bits per channel.
constexpr int kPrecisionBits = 32 - 8 - 2;

double bicubic_filter(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}
constexpr double kBicubicSupport = 2.0;

// Per output index: first input index, tap count, and ksize fixed-point weights (Pillow's
// precompute_coeffs + normalize_coeffs_8bpc for box = [0, in_size]).
struct Coeffs {
  int ksize = 0;
  std::vector<int> xmin, xcount;
  std::vector<int32_t> k;  // [out, ksize]
};

Coeffs precompute_coeffs(int in_size, int out_size) {
  const float in0 = 0.f, in1 = static_cast<float>(in_size);
  const double scale = static_cast<double>(in1 - in0) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = kBicubicSupport * filterscale;
  Coeffs c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.xmin.resize(out_size);
  c.xcount.resize(out_size);
  c.k.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> w(c.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      w[x] = bicubic_filter((x + xmin - center + 0.5) * ss);
      ww += w[x];
    }
    for (int x = 0; x < xmax; ++x) {
      if (ww != 0.0) w[x] /= ww;
      const double v = w[x] * (1 << kPrecisionBits);
      c.k[static_cast<size_t>(xx) * c.ksize + x] = v < 0 ? static_cast<int32_t>(-0.5 + v) : static_cast<int32_t>(0.5 + v);
    }
    c.xmin[xx] = xmin;
    c.xcount[xx] = xmax;
  }
  return c;
}

inline uint8_t clip8(int32_t v) {
  const int32_t s = v >> kPrecisionBits;  // arithmetic shift, as in Pillow's clip8 lookup
  return static_cast<uint8_t>(s < 0 ? 0 : (s > 255 ? 255 : s));
}

Image resample_horizontal(const Image& in, int out_w) {
  const Coeffs c = precompute_coeffs(in.width, out_w);
  Image out;
  out.width = out_w;
  out.height = in.height;
  out.rgb.resize(static_cast<size_t>(out_w) * in.height * 3);
  for (int y = 0; y < in.height; ++y) {
    const uint8_t* row = in.pixel(0, y);
    for (int xx = 0; xx < out_w; ++xx) {
      const int32_t* k = &c.k[static_cast<size_t>(xx) * c.ksize];
      const uint8_t* p = row + 3 * c.xmin[xx];
      int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
      for (int x = 0; x < c.xcount[xx]; ++x) {
        s0 += p[3 * x + 0] * k[x];
        s1 += p[3 * x + 1] * k[x];
        s2 += p[3 * x + 2] * k[x];
      }
      uint8_t* o = out.pixel(xx, y);
      o[0] = clip8(s0);
      o[1] = clip8(s1);
      o[2] = clip8(s2);
    }
  }
  return out;
}

Image resample_vertical(const Image& in, int out_h) {
  const Coeffs c = precompute_coeffs(in.height, out_h);
  Image out;
  out.width = in.width;
  out.height = out_h;
  out.rgb.resize(static_cast<size_t>(in.width) * out_h * 3);
  const size_t stride = static_cast<size_t>(in.width) * 3;
  for (int yy = 0; yy < out_h; ++yy) {
    const int32_t* k = &c.k[static_cast<size_t>(yy) * c.ksize];
    const uint8_t* base = in.rgb.data() + stride * c.xmin[yy];
    uint8_t* o = out.pixel(0, yy);
    for (size_t i = 0; i < stride; ++i) {
      int32_t s = 1 << (kPrecisionBits - 1);
      for (int y = 0; y < c.xcount[yy]; ++y) s += base[stride * y + i] * k[y];
      o[i] = clip8(s);
    }
  }
  return out;
}

int json_int(const nlohmann::json& v, const std::string& path, const char* key) {
  if (!v.is_number_integer()) throw std::runtime_error(path + ": '" + key + "' must be an integer, got " + v.dump());
  return v.get<int>();
}

std::array<float, 3> json_rgb(const nlohmann::json& v, const std::string& path, const char* key) {
  if (!v.is_array() || v.size() != 3)
    throw std::runtime_error(path + ": '" + key + "' must be a list of 3 numbers, got " + v.dump());
  std::array<float, 3> out{};
  for (int i = 0; i < 3; ++i) {
    if (!v[i].is_number()) throw std::runtime_error(path + ": '" + key + "' must be numeric, got " + v.dump());
    out[i] = static_cast<float>(v[i].get<double>());
  }
  return out;
}

}  // namespace

ClipPreprocessConfig load_preprocess_config(const std::string& path_in) {
  std::string path = path_in;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) path += "/preprocessor_config.json";
  std::ifstream f(path);
  if (!f) throw std::runtime_error(path + ": cannot open preprocessor config");
  nlohmann::json j;
  try {
    f >> j;
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": invalid JSON: " + e.what());
  }
  if (!j.is_object()) throw std::runtime_error(path + ": expected a JSON object");
  ClipPreprocessConfig cfg;
  if (j.contains("crop_size")) {
    const auto& c = j["crop_size"];
    if (c.is_object()) {
      if (!c.contains("height") || !c.contains("width"))
        throw std::runtime_error(path + ": 'crop_size' needs height and width, got " + c.dump());
      const int h = json_int(c["height"], path, "crop_size.height"), w = json_int(c["width"], path, "crop_size.width");
      if (h != w) throw std::runtime_error(path + ": only square crop_size is supported, got " + c.dump());
      cfg.crop = h;
    } else {
      cfg.crop = json_int(c, path, "crop_size");
    }
  }
  if (j.contains("size")) {
    const auto& s = j["size"];
    if (s.is_object() && s.contains("height") && s.contains("width") && !s.contains("shortest_edge")) {
      const int h = json_int(s["height"], path, "size.height"), w = json_int(s["width"], path, "size.width");
      if (h != w) throw std::runtime_error(path + ": only a square size {height, width} is supported, got " + s.dump());
      cfg.size = h;
      cfg.resize_square = true;
      const bool crops = j.contains("crop_size") && j.contains("do_center_crop") &&
                         j["do_center_crop"].is_boolean() && j["do_center_crop"].get<bool>();
      if (!crops) cfg.crop = h;
    } else if (s.is_object()) {
      if (!s.contains("shortest_edge"))
        throw std::runtime_error(path + ": only size.shortest_edge or a square {height, width} is supported, got " +
                                 s.dump());
      cfg.size = json_int(s["shortest_edge"], path, "size.shortest_edge");
    } else {
      cfg.size = json_int(s, path, "size");
    }
  }
  if (j.contains("image_mean")) cfg.mean = json_rgb(j["image_mean"], path, "image_mean");
  if (j.contains("image_std")) cfg.std = json_rgb(j["image_std"], path, "image_std");
  if (j.contains("resample") && !(j["resample"].is_number_integer() && j["resample"].get<int>() == 3))
    throw std::runtime_error(path + ": only resample = 3 (BICUBIC) is supported, got " + j["resample"].dump());
  if (cfg.size <= 0 || cfg.crop <= 0)
    throw std::runtime_error(path + ": size and crop_size must be positive");
  return cfg;
}

std::array<uint8_t, 3> pad_color(const ClipPreprocessConfig& cfg) {
  std::array<uint8_t, 3> bg{};
  for (int c = 0; c < 3; ++c) {
    const double v = static_cast<double>(cfg.mean[c]) * 255.0;
    bg[c] = static_cast<uint8_t>(std::clamp(static_cast<int>(v), 0, 255));  // Python int(): truncation
  }
  return bg;
}

Image expand_to_square(const Image& img, std::array<uint8_t, 3> bg) {
  if (img.width == img.height) return img;
  const int n = std::max(img.width, img.height);
  Image out;
  out.width = out.height = n;
  out.rgb.resize(static_cast<size_t>(n) * n * 3);
  for (size_t i = 0; i < out.rgb.size(); i += 3) {
    out.rgb[i] = bg[0];
    out.rgb[i + 1] = bg[1];
    out.rgb[i + 2] = bg[2];
  }
  const int x0 = img.width > img.height ? 0 : (img.height - img.width) / 2;
  const int y0 = img.width > img.height ? (img.width - img.height) / 2 : 0;
  for (int y = 0; y < img.height; ++y)
    std::copy(img.pixel(0, y), img.pixel(0, y) + static_cast<size_t>(img.width) * 3, out.pixel(x0, y0 + y));
  return out;
}

Image resize_bicubic(const Image& img, int out_w, int out_h) {
  if (out_w <= 0 || out_h <= 0 || img.width <= 0 || img.height <= 0)
    throw std::runtime_error("resize_bicubic: bad sizes " + std::to_string(img.width) + "x" +
                             std::to_string(img.height) + " -> " + std::to_string(out_w) + "x" + std::to_string(out_h));
  // Pillow skips a pass whose size does not change (and returns a copy if neither does).
  const bool need_h = out_w != img.width, need_v = out_h != img.height;
  if (!need_h && !need_v) return img;
  if (need_h && need_v) return resample_vertical(resample_horizontal(img, out_w), out_h);
  return need_h ? resample_horizontal(img, out_w) : resample_vertical(img, out_h);
}

std::array<int, 2> shortest_edge_size(int height, int width, int size) {
  const int shorter = std::min(height, width), longer = std::max(height, width);
  const int new_long = static_cast<int>(static_cast<double>(static_cast<int64_t>(size) * longer) / shorter);
  if (width <= height) return {new_long, size};
  return {size, new_long};
}

std::vector<float> clip_preprocess(const Image& img, const ClipPreprocessConfig& cfg) {
  if (img.width <= 0 || img.height <= 0 || img.rgb.size() != static_cast<size_t>(img.width) * img.height * 3)
    throw std::runtime_error("clip_preprocess: invalid image " + std::to_string(img.width) + "x" +
                             std::to_string(img.height) + " with " + std::to_string(img.rgb.size()) + " bytes");
  const Image sq = cfg.pad_to_square ? expand_to_square(img, pad_color(cfg)) : img;
  const auto hw = cfg.resize_square ? std::array<int, 2>{cfg.size, cfg.size}
                                    : shortest_edge_size(sq.height, sq.width, cfg.size);
  const Image rs = resize_bicubic(sq, hw[1], hw[0]);

  // transformers center_crop: offset (H - crop) // 2 when the image is large enough; otherwise it
  // zero-pads with the image at ceil((crop - H) / 2). Both reduce to this per-axis offset.
  const int crop = cfg.crop;
  const int oy = rs.height >= crop ? (rs.height - crop) / 2 : -((crop - rs.height + 1) / 2);
  const int ox = rs.width >= crop ? (rs.width - crop) / 2 : -((crop - rs.width + 1) / 2);

  // rescale: float32(float64(v) * (1/255)); normalise in float32, as numpy does.
  const double rescale = 1.0 / 255.0;
  float lut[256];
  for (int v = 0; v < 256; ++v) lut[v] = static_cast<float>(static_cast<double>(v) * rescale);
  std::vector<float> out(static_cast<size_t>(3) * crop * crop);  // [3, crop, crop]
  for (int c = 0; c < 3; ++c) {
    float* plane = &out[static_cast<size_t>(c) * crop * crop];
    for (int y = 0; y < crop; ++y) {
      const int sy = y + oy;
      for (int x = 0; x < crop; ++x) {
        const int sx = x + ox;
        const bool inside = sy >= 0 && sy < rs.height && sx >= 0 && sx < rs.width;
        const float v = inside ? lut[rs.pixel(sx, sy)[c]] : 0.0f;
        plane[static_cast<size_t>(y) * crop + x] = (v - cfg.mean[c]) / cfg.std[c];
      }
    }
  }
  return out;
}

}  // namespace gmod

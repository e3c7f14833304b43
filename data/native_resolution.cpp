// Qwen2-VL native-resolution preprocessing. See native_resolution.h.
#include "data/native_resolution.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <stdexcept>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

namespace gmod {
namespace {

// ATen's antialiased cubic filter (a = -0.5, Keys) in double, as its uint8 path evaluates it.
double aa_cubic(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0.0;
}

// Per output index: first input index, tap count and int16 fixed-point weights with `precision` fraction bits: ATen's
// _compute_index_ranges_int16_weights (align_corners = false, no explicit scale). The weights are computed and
// normalised in double; the precision is the largest (< 22) at which the largest weight still fits an int16.
struct AaWeights {
  int ksize = 0;
  int precision = 0;
  std::vector<int> xmin, xsize;
  std::vector<int32_t> w;  // [out, ksize]
};

AaWeights aa_weights(int in_size, int out_size) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double support = scale >= 1.0 ? 4 * 0.5 * scale : 4 * 0.5;
  const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
  AaWeights c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.xmin.resize(out_size);
  c.xsize.resize(out_size);
  std::vector<double> wd(static_cast<size_t>(out_size) * c.ksize, 0.0);
  double wt_max = 0.0;
  for (int i = 0; i < out_size; ++i) {
    const double center = scale * (i + 0.5);
    const int64_t xmin = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const int64_t xsize = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in_size) - xmin;
    double* w = &wd[static_cast<size_t>(i) * c.ksize];
    double total = 0.0;
    for (int64_t j = 0; j < xsize; ++j) {
      w[j] = aa_cubic((j + xmin - center + 0.5) * invscale);
      total += w[j];
    }
    if (total != 0.0)
      for (int64_t j = 0; j < xsize; ++j) {
        w[j] /= total;
        wt_max = std::max(wt_max, w[j]);
      }
    c.xmin[i] = static_cast<int>(xmin);
    c.xsize[i] = static_cast<int>(xsize);
  }
  int precision = 0;
  for (; precision < 22; ++precision)
    if (static_cast<int>(0.5 + wt_max * (1 << (precision + 1))) >= (1 << 15)) break;
  c.precision = precision;
  c.w.resize(wd.size());
  for (size_t k = 0; k < wd.size(); ++k) {
    const double v = wd[k] * (1 << precision);
    c.w[k] = static_cast<int16_t>(v < 0 ? static_cast<int>(-0.5 + v) : static_cast<int>(0.5 + v));
  }
  return c;
}

// One pass over an RGB image: resamples the x axis (horizontal) or the y axis, each output rounded by the
// fixed-point shift and clamped to uint8 (so the second pass reads uint8, as in ATen and Pillow).
Image resample_axis(const Image& in, int out, bool horizontal) {
  const AaWeights c = aa_weights(horizontal ? in.width : in.height, out);
  Image res;
  res.width = horizontal ? out : in.width;
  res.height = horizontal ? in.height : out;
  res.rgb.resize(static_cast<size_t>(res.width) * res.height * 3);
  const int64_t step = horizontal ? 3 : int64_t(in.width) * 3;
  for (int y = 0; y < res.height; ++y)
    for (int x = 0; x < res.width; ++x) {
      const int i = horizontal ? x : y;
      const int32_t* wt = &c.w[static_cast<size_t>(i) * c.ksize];
      const uint8_t* s = horizontal ? in.pixel(c.xmin[i], y) : in.pixel(x, c.xmin[i]);
      uint8_t* o = res.pixel(x, y);
      for (int ch = 0; ch < 3; ++ch) {
        int32_t acc = 1 << (c.precision - 1);
        for (int j = 0; j < c.xsize[i]; ++j) acc += s[j * step + ch] * wt[j];
        o[ch] = static_cast<uint8_t>(std::clamp(acc >> c.precision, 0, 255));
      }
    }
  return res;
}

int json_positive(const nlohmann::json& j, const char* key, int64_t fallback, const std::string& path) {
  if (!j.contains(key)) return static_cast<int>(fallback);
  const auto& v = j[key];
  if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (int64_t(1) << 30))
    throw std::runtime_error(path + ": '" + key + "' must be a positive integer, got " + v.dump());
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
  if (std::string(key) == "image_std")
    for (float s : out)
      if (!(s > 0.0f)) throw std::runtime_error(path + ": 'image_std' must be positive, got " + v.dump());
  return out;
}

}  // namespace

NativeResolutionConfig load_native_resolution_config(const std::string& path_in) {
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
  NativeResolutionConfig cfg;
  cfg.patch_size = json_positive(j, "patch_size", cfg.patch_size, path);
  cfg.temporal_patch_size = json_positive(j, "temporal_patch_size", cfg.temporal_patch_size, path);
  cfg.merge_size = json_positive(j, "merge_size", cfg.merge_size, path);
  if (j.contains("size")) {
    const auto& s = j["size"];
    if (!s.is_object()) throw std::runtime_error(path + ": 'size' must be an object, got " + s.dump());
    cfg.min_pixels = json_positive(s, "shortest_edge", cfg.min_pixels, path);
    cfg.max_pixels = json_positive(s, "longest_edge", cfg.max_pixels, path);
  }
  cfg.min_pixels = json_positive(j, "min_pixels", cfg.min_pixels, path);
  cfg.max_pixels = json_positive(j, "max_pixels", cfg.max_pixels, path);
  if (cfg.min_pixels > cfg.max_pixels)
    throw std::runtime_error(path + ": min_pixels " + std::to_string(cfg.min_pixels) + " exceeds max_pixels " +
                             std::to_string(cfg.max_pixels));
  if (j.contains("image_mean")) cfg.mean = json_rgb(j["image_mean"], path, "image_mean");
  if (j.contains("image_std")) cfg.std = json_rgb(j["image_std"], path, "image_std");
  if (j.contains("resample") && !(j["resample"].is_number_integer() && j["resample"].get<int>() == 3))
    throw std::runtime_error(path + ": only resample = 3 (bicubic) is supported, got " + j["resample"].dump());
  if (j.contains("rescale_factor") &&
      !(j["rescale_factor"].is_number() && std::abs(j["rescale_factor"].get<double>() * 255.0 - 1.0) < 1e-9))
    throw std::runtime_error(path + ": only rescale_factor = 1/255 is supported, got " + j["rescale_factor"].dump());
  for (const char* key : {"do_resize", "do_rescale", "do_normalize"})
    if (j.contains(key) && !(j[key].is_boolean() && j[key].get<bool>()))
      throw std::runtime_error(path + ": '" + key + "' must be true (the only mode supported), got " + j[key].dump());
  return cfg;
}

std::array<int, 2> smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels) {
  if (height <= 0 || width <= 0 || factor <= 0)
    throw std::invalid_argument("smart_resize: height, width and factor must be positive, got " +
                                std::to_string(height) + "x" + std::to_string(width) + ", factor " +
                                std::to_string(factor));
  const double ratio = static_cast<double>(std::max(height, width)) / std::min(height, width);
  if (ratio > 200)
    throw std::invalid_argument("smart_resize: aspect ratio must be at most 200, got " + std::to_string(ratio) +
                                " for " + std::to_string(width) + "x" + std::to_string(height));
  // Python's round() rounds halves to even, as std::nearbyint does in the default rounding mode.
  int64_t h_bar = static_cast<int64_t>(std::nearbyint(static_cast<double>(height) / factor)) * factor;
  int64_t w_bar = static_cast<int64_t>(std::nearbyint(static_cast<double>(width) / factor)) * factor;
  const double area = static_cast<double>(static_cast<int64_t>(height) * width);
  if (h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt(area / static_cast<double>(max_pixels));
    h_bar = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(height / beta / factor)) * factor);
    w_bar = std::max<int64_t>(factor, static_cast<int64_t>(std::floor(width / beta / factor)) * factor);
  } else if (h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / area);
    h_bar = static_cast<int64_t>(std::ceil(height * beta / factor)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(width * beta / factor)) * factor;
  }
  return {static_cast<int>(h_bar), static_cast<int>(w_bar)};
}

Image resize_bicubic_aa(const Image& img, int out_w, int out_h) {
  if (out_w <= 0 || out_h <= 0 || img.width <= 0 || img.height <= 0 ||
      img.rgb.size() != static_cast<size_t>(img.width) * img.height * 3)
    throw std::invalid_argument("resize_bicubic_aa: bad sizes " + std::to_string(img.width) + "x" +
                                std::to_string(img.height) + " -> " + std::to_string(out_w) + "x" +
                                std::to_string(out_h));
  // ATen resamples the contiguous (x) axis first, then y; an axis whose size does not change is left alone.
  Image out = out_w != img.width ? resample_axis(img, out_w, true) : img;
  if (out_h != img.height) out = resample_axis(out, out_h, false);
  return out;
}

NativePatches patchify_frames(const std::vector<Image>& resized, const NativeResolutionConfig& cfg) {
  if (resized.empty()) throw std::invalid_argument("patchify_frames: no frames");
  const int P = cfg.patch_size, M = cfg.merge_size, T = cfg.temporal_patch_size;
  const int H = resized[0].height, W = resized[0].width;
  if (H <= 0 || W <= 0 || H % (P * M) != 0 || W % (P * M) != 0)
    throw std::invalid_argument("patchify_frames: frame size " + std::to_string(W) + "x" + std::to_string(H) +
                                " is not a positive multiple of patch_size * merge_size = " + std::to_string(P * M));
  for (size_t f = 0; f < resized.size(); ++f)
    if (resized[f].height != H || resized[f].width != W ||
        resized[f].rgb.size() != static_cast<size_t>(W) * H * 3)
      throw std::invalid_argument("patchify_frames: frame " + std::to_string(f) + " is " +
                                  std::to_string(resized[f].width) + "x" + std::to_string(resized[f].height) +
                                  ", frame 0 is " + std::to_string(W) + "x" + std::to_string(H));
  // (v - 255 mean) / (255 std) in float32: transformers folds the 1/255 rescale into mean and std.
  float lut[3][256];
  for (int c = 0; c < 3; ++c) {
    const float m = cfg.mean[c] * 255.0f, s = cfg.std[c] * 255.0f;
    for (int v = 0; v < 256; ++v) lut[c][v] = (static_cast<float>(v) - m) / s;
  }
  const int64_t frames = static_cast<int64_t>(resized.size());
  const int64_t gt = (frames + T - 1) / T, gh = H / P, gw = W / P;
  NativePatches out;
  out.grid_thw = {gt, gh, gw};
  out.row_size = int64_t(3) * T * P * P;
  out.pixel_values.resize(static_cast<size_t>(gt * gh * gw * out.row_size));
  float* dst = out.pixel_values.data();
  for (int64_t t = 0; t < gt; ++t)
    for (int64_t bh = 0; bh < gh / M; ++bh)
      for (int64_t bw = 0; bw < gw / M; ++bw)
        for (int mh = 0; mh < M; ++mh)
          for (int mw = 0; mw < M; ++mw) {
            const int64_t y0 = (bh * M + mh) * P, x0 = (bw * M + mw) * P;
            for (int c = 0; c < 3; ++c)
              for (int dt = 0; dt < T; ++dt) {
                const Image& fr = resized[static_cast<size_t>(std::min(t * T + dt, frames - 1))];
                for (int py = 0; py < P; ++py)
                  for (int px = 0; px < P; ++px)
                    *dst++ = lut[c][fr.pixel(static_cast<int>(x0 + px), static_cast<int>(y0 + py))[c]];
              }
          }
  return out;
}

NativePatches preprocess_native_image(const Image& img, const NativeResolutionConfig& cfg) {
  const auto hw = smart_resize(img.height, img.width, cfg.factor(), cfg.min_pixels, cfg.max_pixels);
  const Image rs = resize_bicubic_aa(img, hw[1], hw[0]);
  return patchify_frames(std::vector<Image>(static_cast<size_t>(cfg.temporal_patch_size), rs), cfg);
}

}  // namespace gmod

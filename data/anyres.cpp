// AnyRes preprocessing (see anyres.h).
#include "data/anyres.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace gmod {

std::array<int, 2> anyres_resize_size(int height, int width, std::array<int, 2> target) {
  const double scale_w = static_cast<double>(target[1]) / width, scale_h = static_cast<double>(target[0]) / height;
  if (scale_w < scale_h)
    return {std::min(static_cast<int>(std::ceil(height * scale_w)), target[0]), target[1]};
  return {target[0], std::min(static_cast<int>(std::ceil(width * scale_h)), target[1])};
}

Image anyres_resize_and_pad(const Image& img, std::array<int, 2> target) {
  const auto hw = anyres_resize_size(img.height, img.width, target);
  const Image rs = resize_bicubic(img, hw[1], hw[0]);
  Image out;
  out.height = target[0];
  out.width = target[1];
  out.rgb.assign(static_cast<size_t>(out.width) * out.height * 3, 0);
  const int y0 = (target[0] - hw[0]) / 2, x0 = (target[1] - hw[1]) / 2;
  for (int y = 0; y < rs.height; ++y)
    std::copy(rs.pixel(0, y), rs.pixel(0, y) + static_cast<size_t>(rs.width) * 3, out.pixel(x0, y0 + y));
  return out;
}

AnyresImage anyres_preprocess(const Image& img, const ClipPreprocessConfig& cfg, const AnyresConfig& anyres) {
  if (img.width <= 0 || img.height <= 0 || img.rgb.size() != static_cast<size_t>(img.width) * img.height * 3)
    throw std::invalid_argument("anyres_preprocess: invalid image " + std::to_string(img.width) + "x" +
                                std::to_string(img.height) + " with " + std::to_string(img.rgb.size()) + " bytes");
  const int tile = cfg.crop;
  AnyresImage out;
  out.crop = tile;
  out.image_size = {img.height, img.width};
  out.grid = anyres_grid_shape(img.height, img.width, anyres, tile);
  const auto best = std::array<int, 2>{out.grid[0] * tile, out.grid[1] * tile};
  const Image padded = anyres_resize_and_pad(img, best);

  ClipPreprocessConfig per_tile = cfg;
  per_tile.pad_to_square = false;
  const size_t tile_values = static_cast<size_t>(3) * tile * tile;
  out.tiles = out.grid[0] * out.grid[1] + 1;
  out.pixels.reserve(tile_values * out.tiles);
  auto append = [&](const Image& t) {
    const auto v = clip_preprocess(t, per_tile);
    out.pixels.insert(out.pixels.end(), v.begin(), v.end());
  };
  append(resize_bicubic(img, cfg.size, cfg.size));  // the base image: the tower's size, aspect not kept
  Image t;
  t.width = t.height = tile;
  t.rgb.resize(static_cast<size_t>(tile) * tile * 3);
  for (int r = 0; r < out.grid[0]; ++r)
    for (int c = 0; c < out.grid[1]; ++c) {
      for (int y = 0; y < tile; ++y)
        std::copy(padded.pixel(c * tile, r * tile + y), padded.pixel(c * tile, r * tile + y) + size_t(tile) * 3,
                  t.pixel(0, y));
      append(t);
    }
  return out;
}

}  // namespace gmod

// AnyRes geometry (see anyres_grid.h).
#include "model/anyres_grid.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace gmod {
namespace {

// int(round(x, 7)) for x >= 0 as Python computes it: a value within 5e-8 of an integer counts as that integer,
// anything else is truncated. (Python rounds the decimal expansion exactly; the two agree except within float
// noise of a half at the 8th decimal, which no image size produces.)
int round7_then_int(double x) {
  const double r = std::nearbyint(x);
  if (std::fabs(x - r) < 5e-8) return static_cast<int>(r);
  return static_cast<int>(x);
}

// Python's float a // b for a >= 0, b > 0 (CPython's float_floor_div: from fmod, not floor(a / b), which can round
// up across an integer).
double py_floordiv(double a, double b) {
  const double mod = std::fmod(a, b);
  const double div = (a - mod) / b;
  double q = std::floor(div);
  if (div - q > 0.5) q += 1.0;
  return q;
}

void check_size(int height, int width, const char* what) {
  if (height <= 0 || width <= 0)
    throw std::invalid_argument(std::string(what) + ": image size " + std::to_string(height) + "x" +
                                std::to_string(width) + " (height x width) must be positive");
}

}  // namespace

std::array<int, 2> select_best_resolution(int height, int width, const std::vector<std::array<int, 2>>& pinpoints) {
  check_size(height, width, "select_best_resolution");
  if (pinpoints.empty()) throw std::invalid_argument("select_best_resolution: image_grid_pinpoints is empty");
  std::array<int, 2> best{0, 0};
  int64_t best_effective = 0;
  int64_t best_wasted = std::numeric_limits<int64_t>::max();
  const int64_t area = int64_t(height) * width;
  for (const auto& p : pinpoints) {
    const int ph = p[0], pw = p[1];
    const double scale = std::min(static_cast<double>(pw) / width, static_cast<double>(ph) / height);
    const int64_t dw = static_cast<int64_t>(width * scale), dh = static_cast<int64_t>(height * scale);
    const int64_t effective = std::min(dw * dh, area);
    const int64_t wasted = int64_t(pw) * ph - effective;
    if (effective > best_effective || (effective == best_effective && wasted < best_wasted)) {
      best_effective = effective;
      best_wasted = wasted;
      best = p;
    }
  }
  return best;
}

std::array<int, 2> anyres_grid_shape(int height, int width, const AnyresConfig& c, int tile) {
  const auto best = select_best_resolution(height, width, c.pinpoints);
  if (tile <= 0 || best[0] % tile || best[1] % tile)
    throw std::invalid_argument("image_grid_pinpoints: resolution " + std::to_string(best[0]) + "x" +
                                std::to_string(best[1]) + " is not a multiple of the tile size " +
                                std::to_string(tile));
  return {best[0] / tile, best[1] / tile};
}

std::array<int, 2> anyres_max_grid(int rows, int cols, int side, int max_patches) {
  if (max_patches <= 0 || side <= 0) return {rows, cols};
  const double ratio = std::sqrt(static_cast<double>(int64_t(rows) * cols) / (double(max_patches) * side * side));
  if (!(ratio > 1.1)) return {rows, cols};
  return {static_cast<int>(py_floordiv(rows, ratio)), static_cast<int>(py_floordiv(cols, ratio))};
}

int anyres_num_tiles(int height, int width, const AnyresConfig& c, int tile) {
  if (c.max_patches > 0 && anyres_base_only(height, width)) return 1;
  const auto g = anyres_grid_shape(height, width, c, tile);
  return g[0] * g[1] + 1;
}

UnpadBox anyres_unpad_box(int height, int width, int rows, int cols, bool truncate) {
  check_size(height, width, "spatial_unpad");
  UnpadBox b{0, rows, 0, cols};
  const double image_aspect = static_cast<double>(width) / height, grid_aspect = static_cast<double>(cols) / rows;
  if (image_aspect > grid_aspect) {  // wider than the grid: padding above and below
    const double x = height * (static_cast<double>(cols) / width);
    const int new_rows = truncate ? static_cast<int>(x) : round7_then_int(x);
    const int pad = (rows - new_rows) / 2;
    b.r0 = pad;
    b.r1 = rows - pad;
  } else {
    const double x = width * (static_cast<double>(rows) / height);
    const int new_cols = truncate ? static_cast<int>(x) : round7_then_int(x);
    const int pad = (cols - new_cols) / 2;
    b.c0 = pad;
    b.c1 = cols - pad;
  }
  return b;
}

int64_t anyres_max_image_tokens(const AnyresConfig& c, int tile, int side) {
  int64_t best = int64_t(side) * side + 1;  // a base-only image (OneVision) or the base image alone
  for (const auto& p : c.pinpoints) {
    if (tile <= 0) break;
    const int rows = p[0] / tile * side, cols = p[1] / tile * side;
    auto consider = [&](int r, int k) {
      const auto m = anyres_max_grid(r, k, side, c.max_patches);
      best = std::max(best, int64_t(side) * side + int64_t(m[0]) * (m[1] + 1));
    };
    for (int r = 1; r <= rows; ++r) consider(r, cols);
    for (int k = 1; k <= cols; ++k) consider(rows, k);
  }
  return best;
}

int anyres_image_tokens(int height, int width, const AnyresConfig& c, int tile, int side) {
  if (c.max_patches > 0 && anyres_base_only(height, width)) return side * side + 1;
  const auto g = anyres_grid_shape(height, width, c, tile);
  const auto b = anyres_unpad_box(height, width, g[0] * side, g[1] * side, c.unpad_truncates);
  const auto m = anyres_max_grid(b.r1 - b.r0, b.c1 - b.c0, side, c.max_patches);
  return side * side + m[0] * (m[1] + 1);
}

}  // namespace gmod

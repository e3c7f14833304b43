// LLaVA-NeXT's AnyRes geometry, shared by the image preprocessing (data/anyres.h) and the model's packing of tile
// features (model/llava_next.h): which of the `image_grid_pinpoints` an image is resized into, the grid of tiles
// that gives, where spatial_unpad cuts the padding off the grid's feature map, and how many LLM positions an image
// then takes. Sizes are (height, width) throughout, in transformers' order; the original LLaVA code writes them as
// (width, height), and its configs are converted on reading (model/config.cpp). LLaVA-OneVision's `anyres_max_N`
// adds a downscale of large grids and gives an image of a sample with several images its base tile only. Torch-free.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace gmod {

struct AnyresConfig {
  // Candidate resolutions (height, width) in the order the checkpoint lists them: the first of equally good ones
  // wins, so the order is part of the model.
  std::vector<std::array<int, 2>> pinpoints;
  // spatial_unpad's size of the image inside the grid: transformers rounds to 7 decimals before truncating
  // (int(round(x, 7))), the original LLaVA code truncates (int(x)). They differ when x lies just below an
  // integer, e.g. 23.999999999.
  bool unpad_truncates = false;
  // LLaVA-OneVision's vision_aspect_ratio `anyres_max_N`: N (0: LLaVA-NeXT, no such rule). An unpadded grid of more
  // than about N base images' patches is downscaled (anyres_max_grid), and an image of a sample with several images
  // takes its base tile and one newline only (anyres_base_only).
  int max_patches = 0;
  // LLaVA-OneVision's video_token_index (-1: none): a video's frames take these positions (model/llava_next.h).
  int video_token_id = -1;
};

// LLaVA-OneVision's multi-image rule in an image_sizes row: a sample with several images gives each of them its
// base tile only (transformers' batch_num_images), marked by writing the image's size negated, (-height, -width).
// Such an image is 1 tile and side^2 + 1 positions (its patches and one newline). Only for max_patches > 0.
inline bool anyres_base_only(int height, int width) { return height < 0 && width < 0; }

// anyres_max_N's downscale of an unpadded feature grid of `rows` x `cols` (tiles of side x side patches): when
// ratio = sqrt(rows * cols / (N * side^2)) exceeds 1.1 the grid is resized (bilinear) to (rows // ratio,
// cols // ratio), Python's float floor division, as transformers' pack_image_features and its processor compute
// it; otherwise (and for N = 0) it stays. Returns (rows, cols) after.
std::array<int, 2> anyres_max_grid(int rows, int cols, int side, int max_patches);

// transformers' / LLaVA's select_best_resolution for an image of `height` x `width`: the candidate that keeps the
// most of the image's pixels when it is scaled to fit inside (capped at the image's own area), then the one that
// wastes the least; ties keep the earlier candidate. Returns (height, width). Throws for an empty list or a
// non-positive size.
std::array<int, 2> select_best_resolution(int height, int width, const std::vector<std::array<int, 2>>& pinpoints);

// The tile grid (rows, cols) of an image: the best resolution divided by the tile side.
std::array<int, 2> anyres_grid_shape(int height, int width, const AnyresConfig& c, int tile);

// Tiles per image: the grid's, plus the base image resized to the tower's size (which comes first); 1 for a
// base-only image (anyres_base_only).
int anyres_num_tiles(int height, int width, const AnyresConfig& c, int tile);

// spatial_unpad on a feature map of `rows` x `cols` (the grid's patches): the half-open ranges [r0, r1) and [c0,
// c1) that hold the image, from the image's size and the rounding of `c`.
struct UnpadBox {
  int r0 = 0, r1 = 0, c0 = 0, c1 = 0;
};
UnpadBox anyres_unpad_box(int height, int width, int rows, int cols, bool truncate);

// The most LLM positions one image can take under `c` (for planning): over every pinpoint's grid and every extent
// spatial_unpad can leave (one side whole, the other 1 to whole), after anyres_max_grid. Without max_patches that is
// the whole largest grid; with it, a grid just under anyres_max_N's threshold can take more than a downscaled one.
int64_t anyres_max_image_tokens(const AnyresConfig& c, int tile, int side);

// LLM positions of one image: the base image's patches (side^2, `side` = tower image size / patch size), plus
// the unpadded grid feature map (after anyres_max_grid) with one newline per row (rows * (cols + 1)); side^2 + 1 for a
// base-only image.
int anyres_image_tokens(int height, int width, const AnyresConfig& c, int tile, int side);

}  // namespace gmod

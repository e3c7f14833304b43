// AnyRes feature packing (see llava_next.h).
#include "model/llava_next.h"

#include <stdexcept>
#include <string>
#include <vector>

namespace gmod {

at::Tensor pack_anyres_features(const at::Tensor& features, const at::Tensor& image_sizes, const AnyresConfig& c,
                                int tile, int side, const at::Tensor& newline) {
  if (features.dim() != 3 || features.size(1) != int64_t(side) * side)
    throw std::invalid_argument("AnyRes tile features must be [tiles, " + std::to_string(side * side) +
                                ", D], got " + std::to_string(features.dim()) + " dimensions with " +
                                std::to_string(features.dim() > 1 ? features.size(1) : 0) + " tokens a tile");
  if (!image_sizes.defined() || image_sizes.dim() != 2 || image_sizes.size(1) != 2)
    throw std::invalid_argument("AnyRes images need image_sizes [N_images, 2] (height, width)");
  const auto sizes = image_sizes.to(at::kCPU, at::kLong).contiguous();
  const auto* hw = sizes.data_ptr<int64_t>();
  const int64_t D = features.size(2), n_images = sizes.size(0);
  const auto nl = newline.to(features.scalar_type());
  std::vector<at::Tensor> parts;
  int64_t at_tile = 0;
  for (int64_t i = 0; i < n_images; ++i) {
    const int h = static_cast<int>(hw[2 * i]), w = static_cast<int>(hw[2 * i + 1]);
    if (c.max_patches > 0 && anyres_base_only(h, w)) {  // OneVision, one of several images: base tile + newline
      if (at_tile >= features.size(0))
        throw std::invalid_argument("AnyRes image " + std::to_string(i) + " (base tile only) needs tile " +
                                    std::to_string(at_tile) + " but the batch has " +
                                    std::to_string(features.size(0)) + " tiles");
      parts.push_back(features[at_tile]);
      parts.push_back(nl.view({1, D}));
      at_tile += 1;
      continue;
    }
    const auto g = anyres_grid_shape(h, w, c, tile);
    const int64_t n = int64_t(g[0]) * g[1] + 1;
    if (at_tile + n > features.size(0))
      throw std::invalid_argument("AnyRes image " + std::to_string(i) + " (" + std::to_string(h) + "x" +
                                  std::to_string(w) + ") needs tiles " + std::to_string(at_tile) + ".." +
                                  std::to_string(at_tile + n - 1) + " but the batch has " +
                                  std::to_string(features.size(0)) + " tiles");
    parts.push_back(features[at_tile]);  // the base image [side^2, D]
    const int rows = g[0] * side, cols = g[1] * side;
    auto grid = features.narrow(0, at_tile + 1, n - 1)
                    .view({g[0], g[1], side, side, D})
                    .permute({0, 2, 1, 3, 4})
                    .reshape({rows, cols, D});  // the grid's feature map
    const auto b = anyres_unpad_box(h, w, rows, cols, c.unpad_truncates);
    grid = grid.narrow(0, b.r0, b.r1 - b.r0).narrow(1, b.c0, b.c1 - b.c0);
    const auto m = anyres_max_grid(static_cast<int>(grid.size(0)), static_cast<int>(grid.size(1)), side,
                                   c.max_patches);
    if (m[0] != grid.size(0) || m[1] != grid.size(1))  // anyres_max_N: bilinear, as F.interpolate (no corners)
      grid = at::upsample_bilinear2d(grid.permute({2, 0, 1}).unsqueeze(0).contiguous(), {m[0], m[1]}, false)[0]
                 .permute({1, 2, 0});
    grid = at::cat({grid, nl.view({1, 1, D}).expand({grid.size(0), 1, D})}, 1);  // a newline ends every row
    parts.push_back(grid.reshape({-1, D}));
    at_tile += n;
  }
  if (at_tile != features.size(0))
    throw std::invalid_argument("AnyRes batch has " + std::to_string(features.size(0)) + " tiles but its " +
                                std::to_string(n_images) + " image_sizes account for " + std::to_string(at_tile));
  return at::cat(parts, 0);
}

at::Tensor pack_onevision_video_features(const at::Tensor& features, const at::Tensor& video_grid_thw, int side,
                                         const at::Tensor& newline) {
  if (features.dim() != 3 || features.size(1) != int64_t(side) * side)
    throw std::invalid_argument("LLaVA-OneVision video frame features must be [frames, " +
                                std::to_string(side * side) + ", D], got " + std::to_string(features.dim()) +
                                " dimensions");
  if (!video_grid_thw.defined() || video_grid_thw.dim() != 2 || video_grid_thw.size(1) != 3)
    throw std::invalid_argument("LLaVA-OneVision videos need video_grid_thw [N_videos, 3] (frames, side, side)");
  const auto grid = video_grid_thw.to(at::kCPU, at::kLong).contiguous();
  const int64_t D = features.size(2), pooled = (side + 1) / 2;
  // apply_pooling: [frames, D, side, side] -> bilinear to ceil(side / 2), as F.interpolate without corners
  auto maps = features.view({features.size(0), side, side, D}).permute({0, 3, 1, 2}).contiguous();
  auto pooled_maps = at::upsample_bilinear2d(maps, {pooled, pooled}, false)
                         .permute({0, 2, 3, 1})
                         .reshape({features.size(0), pooled * pooled, D});
  const auto nl = newline.to(features.scalar_type()).view({1, D});
  std::vector<at::Tensor> parts;
  int64_t at_frame = 0;
  for (int64_t v = 0; v < grid.size(0); ++v) {
    const int64_t frames = grid[v][0].item<int64_t>();
    if (frames < 1 || grid[v][1].item<int64_t>() != side || grid[v][2].item<int64_t>() != side ||
        at_frame + frames > features.size(0))
      throw std::invalid_argument("LLaVA-OneVision video " + std::to_string(v) + ": video_grid_thw row (" +
                                  std::to_string(frames) + ", " + std::to_string(grid[v][1].item<int64_t>()) + ", " +
                                  std::to_string(grid[v][2].item<int64_t>()) + ") does not fit the batch's " +
                                  std::to_string(features.size(0)) + " frames of " + std::to_string(side) + "x" +
                                  std::to_string(side) + " patches from frame " + std::to_string(at_frame));
    parts.push_back(pooled_maps.narrow(0, at_frame, frames).reshape({-1, D}));
    parts.push_back(nl);
    at_frame += frames;
  }
  if (at_frame != features.size(0))
    throw std::invalid_argument("LLaVA-OneVision videos: " + std::to_string(features.size(0)) +
                                " frames but video_grid_thw accounts for " + std::to_string(at_frame));
  return at::cat(parts, 0);
}

}  // namespace gmod

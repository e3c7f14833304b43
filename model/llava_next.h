// LLaVA-NeXT's packing of AnyRes tile features (transformers' LlavaNextModel.pack_image_features, the original
// LLaVA code's spatial_unpad branch): per image, the base image's patch features, then the grid tiles' features
// laid out as one feature map of (rows * side) x (cols * side), cut to the image by spatial_unpad
// (model/anyres_grid.h), with the learned `image_newline` appended to every row of it, read row by row.
// LLaVA-OneVision (AnyresConfig::max_patches, transformers' LlavaOnevisionModel.pack_image_features): a large grid
// is downscaled bilinearly first (anyres_max_grid), and a base-only image (anyres_base_only) is its base features
// and one newline.
#pragma once

#include <ATen/ATen.h>

#include "model/anyres_grid.h"

namespace gmod {

// `features` [N_tiles, side * side, D]: every image's tiles in order, each image's base tile first and then its
// grid tiles row by row (the layout of data/anyres.h). `image_sizes` [N_images, 2] int64 (height, width) of the
// original images. `newline` [D]. `tile`: the tower's image size; `side`: patches per tile side. Returns the
// features of every image-token position [sum of anyres_image_tokens, D]. Throws std::invalid_argument naming
// the image when the tile count does not match the sizes.
at::Tensor pack_anyres_features(const at::Tensor& features, const at::Tensor& image_sizes, const AnyresConfig& c,
                                int tile, int side, const at::Tensor& newline);

// LLaVA-OneVision's video features (transformers' LlavaOnevisionModel.get_video_features after the projector):
// `features` [frames, side * side, D], every video's frames in order; `video_grid_thw` [N_videos, 3] int64 (frames,
// side, side) per video. Each frame's side x side map is resized bilinearly to ceil(side / 2) a side (apply_pooling),
// a video's frames follow one another, and one `newline` [D] ends the video. Returns [sum of frames *
// ceil(side / 2)^2 + 1, D]. Throws std::invalid_argument naming the video when the frames do not add up.
at::Tensor pack_onevision_video_features(const at::Tensor& features, const at::Tensor& video_grid_thw, int side,
                                         const at::Tensor& newline);

// Positions one video of `frames` frames takes: frames * ceil(side / 2)^2 + 1 (LlavaOnevisionProcessor's count).
inline int64_t onevision_video_tokens(int64_t frames, int side) {
  const int64_t pooled = (side + 1) / 2;
  return frames * pooled * pooled + 1;
}

}  // namespace gmod

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

}  // namespace gmod

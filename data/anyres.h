// LLaVA-NeXT's AnyRes image preprocessing, as transformers' LlavaNextImageProcessor (PIL backend) and the original
// LLaVA code's process_anyres_image do it: pick the best of the `image_grid_pinpoints` (model/anyres_grid.h),
// resize the image into it keeping its aspect (PIL BICUBIC, the scaled side rounded up), pad it centred with black,
// cut it into square tiles of the tower's size in row-major order, and put first the whole image resized to the
// tower's size (aspect not kept). Every tile then goes through CLIP's resize / crop / rescale / normalise
// (data/clip_preprocess.h, without the square padding). Torch-free.
#pragma once

#include <array>
#include <vector>

#include "data/clip_preprocess.h"
#include "data/image.h"
#include "model/anyres_grid.h"

namespace gmod {

struct AnyresImage {
  std::vector<float> pixels;  // [tiles, 3, crop, crop]: the base image, then the grid's tiles row by row
  int tiles = 0;
  int crop = 0;
  std::array<int, 2> image_size{0, 0};  // the original (height, width): the model's image_sizes row
  std::array<int, 2> grid{0, 0};        // tile rows, tile cols
};

// The resized image before padding: (height, width) of the image scaled into `target` (height, width) keeping its
// aspect, the side that does not fill the target rounded up (and capped at the target).
std::array<int, 2> anyres_resize_size(int height, int width, std::array<int, 2> target);

// The image resized into the best resolution and padded (black, centred; an odd remainder goes below / right).
Image anyres_resize_and_pad(const Image& img, std::array<int, 2> target);

// The full pipeline. The tile side is cfg.crop (transformers' crop_size); the base image is resized to
// cfg.size x cfg.size. Throws std::invalid_argument for an empty image or a pinpoint that is not a multiple of
// the tile side.
AnyresImage anyres_preprocess(const Image& img, const ClipPreprocessConfig& cfg, const AnyresConfig& anyres);

}  // namespace gmod

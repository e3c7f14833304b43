// Native-resolution image preprocessing as Qwen2-VL / Qwen2.5-VL take it: the image keeps its aspect ratio and is
// resized to a multiple of patch_size * merge_size within [min_pixels, max_pixels] (smart_resize), rescaled and
// normalised, and cut into flat patches of C * temporal_patch_size * patch_size^2 values in the order the vision
// tower's merger expects (each merge_size x merge_size block of patches consecutive). Matches transformers 5.24's
// Qwen2VLImageProcessor, the torchvision-backed class AutoImageProcessor returns for a Qwen2.5-VL
// preprocessor_config.json: torch's antialiased bicubic resize (a = -0.5, float32, horizontal then vertical pass),
// rounded half-to-even to uint8, then (v - 255 * mean) / (255 * std) in float32. Torch-free. Videos reuse the resize,
// normalisation and patch layout (data/video.h).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "data/image.h"

namespace gmod {

struct NativeResolutionConfig {
  int patch_size = 14;
  int temporal_patch_size = 2;
  int merge_size = 2;
  int64_t min_pixels = 56 * 56;           // transformers' size.shortest_edge
  int64_t max_pixels = 28 * 28 * 1280;    // size.longest_edge
  std::array<float, 3> mean = {0.48145466f, 0.4578275f, 0.40821073f};
  std::array<float, 3> std = {0.26862954f, 0.26130258f, 0.27577711f};
  int factor() const { return patch_size * merge_size; }
};

// Reads patch_size, temporal_patch_size, merge_size, min_pixels / max_pixels (or size.shortest_edge /
// size.longest_edge; min_pixels / max_pixels win, as in transformers), image_mean and image_std from a Hugging Face
// preprocessor_config.json (a directory means <dir>/preprocessor_config.json); a missing key keeps the default above.
// Throws std::runtime_error naming the file for unreadable JSON, a non-positive size, resample other than 3
// (bicubic), rescale_factor other than 1/255, or do_resize / do_rescale / do_normalize set to false.
NativeResolutionConfig load_native_resolution_config(const std::string& path);

// Qwen2-VL's smart_resize: (height, width), each a multiple of `factor`, rounding half-to-even to the nearest
// multiple; if that exceeds max_pixels both sides shrink by sqrt(h*w/max_pixels) and floor (at least `factor`), if it
// is below min_pixels both grow by sqrt(min_pixels/(h*w)) and ceil. Throws std::invalid_argument for non-positive
// sizes or an aspect ratio above 200.
std::array<int, 2> smart_resize(int height, int width, int factor, int64_t min_pixels, int64_t max_pixels);

// torch.nn.functional.interpolate(mode="bicubic", antialias=True, align_corners=False) on the uint8 RGB image
// converted to float, rounded half-to-even and clamped back to uint8: what torchvision's resize does to a uint8 image.
Image resize_bicubic_aa(const Image& img, int out_w, int out_h);

// Flat patches of one image or video: pixel_values [grid_t * grid_h * grid_w, 3 * T * P * P] row-major and its
// grid (grid_thw = {grid_t, grid_h, grid_w}, grid_h = height / P).
struct NativePatches {
  std::vector<float> pixel_values;
  std::array<int64_t, 3> grid_thw{};
  int64_t rows() const { return grid_thw[0] * grid_thw[1] * grid_thw[2]; }
  int64_t row_size = 0;  // 3 * T * P * P
};

// Normalises already-resized frames (all the same size, each a multiple of patch_size * merge_size) and lays them
// out as patches: T consecutive frames form one temporal patch; a frame count not a multiple of T is padded by
// repeating the last frame. Element order of a row: [channel, frame in T, y in P, x in P]; rows ordered by
// (t, h / merge, w / merge, h % merge, w % merge). Throws std::invalid_argument for no frames, mixed sizes or sizes
// not divisible by the factor.
NativePatches patchify_frames(const std::vector<Image>& resized, const NativeResolutionConfig& cfg);

// Full image pipeline: smart_resize, resize_bicubic_aa, and the image repeated temporal_patch_size times;
// grid_thw = {1, h / P, w / P}.
NativePatches preprocess_native_image(const Image& img, const NativeResolutionConfig& cfg);

}  // namespace gmod

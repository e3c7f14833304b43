// CLIP image preprocessing as LLaVA-1.5 does it with `image_aspect_ratio == "pad"`: expand2square with the
// mean colour, then transformers' CLIPImageProcessor (PIL BICUBIC shortest-edge resize, center crop,
// rescale 1/255, normalise). The resize reproduces PIL's ImagingResample (fixed-point separable filter,
// uint8 rounding between passes) so results match the Python pipeline to float rounding. With resize_square it is
// SiglipImageProcessor's (the SigLIP tower's, model/siglip.h): both sides resized to `size`, no aspect kept, then the
// crop (none when crop == size), mean = std = 0.5. Torch-free.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "data/image.h"

namespace gmod {

struct ClipPreprocessConfig {
  int size = 336;  // shortest edge after resize
  int crop = 336;  // square center crop
  std::array<float, 3> mean = {0.48145466f, 0.4578275f, 0.40821073f};
  std::array<float, 3> std = {0.26862954f, 0.26130258f, 0.27577711f};
  bool pad_to_square = true;  // LLaVA image_aspect_ratio == "pad"
  // Resize to size x size whatever the aspect ratio (a processor whose `size` is {height, width}: SigLIP's) instead
  // of the shortest edge to `size`.
  bool resize_square = false;
};

// Reads crop_size (int or {height,width}, must be square), size (int, {shortest_edge}, or a square {height, width}:
// resize_square, as SiglipImageProcessor's; then crop = size unless do_center_crop and crop_size say otherwise),
// image_mean and image_std from a Hugging Face `preprocessor_config.json`; a directory means
// `<dir>/preprocessor_config.json`. Missing keys keep the defaults above; pad_to_square stays true (it is a LLaVA
// setting, not an HF one).
// Throws std::runtime_error naming the file for unreadable JSON or unsupported values (e.g. resample != 3).
ClipPreprocessConfig load_preprocess_config(const std::string& path);

// LLaVA's expand2square: paste `img` centred on a max(w,h) square of colour `bg` (w > h: at y=(w-h)//2;
// h > w: at x=(h-w)//2). Square images are returned unchanged.
Image expand_to_square(const Image& img, std::array<uint8_t, 3> bg);

// The pad colour LLaVA uses: tuple(int(x * 255) for x in image_mean).
std::array<uint8_t, 3> pad_color(const ClipPreprocessConfig& cfg);

// PIL `Image.resize((out_w, out_h), Image.BICUBIC)` on an RGB image, bit-exact with Pillow's
// ImagingResample (a = -0.5 cubic, support scaled by the downsampling factor, 22-bit fixed-point
// coefficients, horizontal pass then vertical pass, each rounded and clipped to uint8).
Image resize_bicubic(const Image& img, int out_w, int out_h);

// (height, width) after transformers' shortest-edge resize: the short side becomes `size`, the long
// side int(size * long / short).
std::array<int, 2> shortest_edge_size(int height, int width, int size);

// Full pipeline. Returns CHW float32 [3, crop, crop]: (pixel / 255 - mean) / std.
std::vector<float> clip_preprocess(const Image& img, const ClipPreprocessConfig& cfg = {});

}  // namespace gmod

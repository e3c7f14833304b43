// Qwen2.5-VL's multimodal rotary positions (M-RoPE): every token has three position ids (temporal, height,
// width). Text tokens carry the same id in all three; the merged tokens of an image or video carry their
// frame, row and column offset from the position the block starts at, and the text after a block continues
// from that start plus the block's larger side (in merged tokens). Video frames step by tokens_per_second *
// second_per_grid_ts, truncated to integers. Each section of the rotary frequency axis (mrope_section:
// temporal, height, width) turns with its own row, so the cos/sin tables come out as [B, L, head_dim], the
// shape the decoder's attention already takes (ForwardState::cos/sin, apply_rotary): M-RoPE changes the
// tables, not the attention.
//
// The ids are those of transformers' Qwen2_5_VLModel.get_rope_index (5.24.0): the image and video tokens of a
// row are found by their ids (a run of consecutive image or video tokens is one image or video), images and
// videos take the next grid of image_grid_thw / video_grid_thw in batch order, padding (attention_mask false)
// gets id 0 and is skipped, and rope_deltas = max id + 1 - real tokens per row (what decoding adds to 1-D
// positions). With MRopeConfig::video_steps_as_frames (Qwen3-VL's get_rope_index) each run of video tokens is
// one temporal step of the next video, a (1, h, w) block like an image, and the video's grid is used up after
// grid_t runs.
#pragma once

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/layers.h"
#include "model/qwen2_5_vl_config.h"

namespace gmod {

struct MRopePositions {
  at::Tensor positions;  // [3, B, L] int64
  at::Tensor deltas;     // [B, 1] int64
};

// input_ids [B, L]; attention_mask [B, L] (bool or integer; undefined = all real); image_grid_thw [n_img, 3]
// and video_grid_thw [n_vid, 3] in patches (undefined when there are none); second_per_grid_ts [n_vid]
// (undefined: 1 s per grid). Throws when a run of image/video tokens does not have its grid's t*h*w/merge^2
// tokens or the grids run out or are left over.
MRopePositions mrope_positions(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                               const at::Tensor& image_grid_thw, const at::Tensor& video_grid_thw,
                               const at::Tensor& second_per_grid_ts, const MRopeConfig& c);

// cos/sin tables for 3-D positions: frequency i of the first mrope_section[0] turns with the temporal id, the
// next mrope_section[1] with the height id, the rest with the width id (the default inverse frequencies of
// rope_theta). Interleaved (Qwen3-VL): frequency i turns with the height id when i % 3 == 1 and
// i < 3 * mrope_section[1], with the width id when i % 3 == 2 and i < 3 * mrope_section[2], else with the temporal
// id (so the temporal axis holds the lowest frequencies' tail), as transformers' Qwen3VLTextRotaryEmbedding.
class MRotaryEmbedding {
 public:
  MRotaryEmbedding(int64_t head_dim, double theta, std::vector<int64_t> mrope_section, bool interleaved = false);
  explicit MRotaryEmbedding(const MRopeConfig& c)
      : MRotaryEmbedding(c.head_dim, c.rope_theta, c.mrope_section, c.interleaved) {}
  // positions [3, B, L] int64 (or [B, L]: the same id on all three axes) -> cos, sin [B, L, head_dim] in
  // `dtype`.
  std::pair<at::Tensor, at::Tensor> cos_sin(const at::Tensor& positions, at::ScalarType dtype) const;

 private:
  RotaryEmbedding rotary_;
  std::vector<int64_t> section_;
  bool interleaved_;
};

}  // namespace gmod

// Where the tokens a MoD layer computes on sit for rotary attention when the model has multimodal rotary positions
// (Qwen2.5-VL's M-RoPE, model/mrope.h): a kept token keeps its 3-D (temporal, height, width) position. The compacted
// rows' cos/sin are the rows of the full-sequence tables (ForwardState::cos/sin, made once per forward from
// ForwardState::mrope_positions [3, B, L]) at the kept indices: the values the dense layers use for the same token,
// bit for bit, with no trigonometry per layer. 1-D models and batches without 3-D positions keep their own path
// (callers compute the 1-D tables as before).
//
// rope_positions "compacted" (0..K-1 over the kept tokens, γ-MoD's and PyramidDrop's official code) has no meaning
// for 3-D ids — an image token's height and width are not a rank in the kept sequence — so M-RoPE models refuse it
// (check_rope_positions at conversion, and each forward with 3-D positions).
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "mod/mod_config.h"
#include "model/decoder_layer.h"

namespace gmod {

// Throws std::invalid_argument naming `where` when rope_positions is "compacted" for a model with mrope_section.
void check_rope_positions(const MoDConfig& cfg, bool mrope_model, const std::string& where);

// When the forward runs with 3-D positions (st.mrope_positions defined): cos/sin [B, K, Dh] of the tokens `index`
// [B, K] names (rows of st.cos / st.sin [B, L, Dh]) and true; refuses rope_positions "compacted" naming
// `layer_idx`. Otherwise false and cos/sin untouched: the caller's 1-D path.
bool kept_mrope_tables(const ForwardState& st, const MoDConfig& cfg, const at::Tensor& index, int layer_idx,
                       at::Tensor& cos, at::Tensor& sin);

}  // namespace gmod

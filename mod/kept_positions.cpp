#include "mod/kept_positions.h"

#include <stdexcept>

#include "mod/mod_layer.h"

namespace gmod {

void check_rope_positions(const MoDConfig& cfg, bool mrope_model, const std::string& where) {
  if (mrope_model && cfg.rope_positions == RopePositions::kCompacted)
    throw std::invalid_argument(
        where + ": mod.rope_positions \"compacted\" (0..K-1 over the kept tokens) has no meaning for the 3-D "
                "positions (M-RoPE, mrope_section) of this model; set \"rope_positions\": \"original\" in the mod "
                "config so that a kept token keeps its temporal, height and width position");
}

bool kept_mrope_tables(const ForwardState& st, const MoDConfig& cfg, const at::Tensor& index, int layer_idx,
                       at::Tensor& cos, at::Tensor& sin) {
  if (!st.mrope_positions.defined()) return false;
  check_rope_positions(cfg, true, "MoD layer " + std::to_string(layer_idx));
  const int64_t B = index.size(0);
  if (!st.cos.defined() || st.cos.dim() != 3 || st.cos.size(0) != B || st.sin.sizes() != st.cos.sizes())
    throw std::logic_error("MoD layer " + std::to_string(layer_idx) +
                           ": 3-D positions without the full-sequence rotary tables ForwardState::cos/sin [B, L, Dh]"
                           " of the batch (B = " + std::to_string(B) + ")");
  cos = gather_tokens(st.cos, index);  // [B, K, Dh]
  sin = gather_tokens(st.sin, index);
  return true;
}

}  // namespace gmod

// Qwen2.5-VL's encoder as the memory plan counts it; each term names what it mirrors in model/qwen2_5_vl_vision.cpp.
// Also the AnyRes (LLaVA-NeXT) bound of one image's tiles and tokens.
// The activation terms are an estimate from the code, not yet checked against a measured peak.
#include "trainer/plan/tower_costs.h"

#include <algorithm>
#include <stdexcept>

namespace gmod {
namespace {

class Qwen25VisionCosts : public TowerCosts {
 public:
  explicit Qwen25VisionCosts(const Qwen25VisionConfig& c) : c_(c) {}

  // One block: norm1, norm2 [D]; attn.qkv [3D, D] + bias, attn.proj [D, D] + bias; mlp.gate_proj, up_proj [F, D] +
  // bias, down_proj [D, F] + bias.
  int64_t block() const {
    const int64_t D = c_.hidden_size, F = c_.intermediate_size;
    return 2 * D + (3 * D * D + 3 * D) + (D * D + D) + 2 * (F * D + F) + (D * F + D);
  }
  // The merger: ln_q [D]; mlp.0 [MD, MD] + bias, mlp.2 [O, MD] + bias (M = spatial_merge_size^2).
  int64_t merger() const {
    const int64_t MD = c_.merge_unit() * c_.hidden_size, O = c_.out_hidden_size;
    return c_.hidden_size + (MD * MD + MD) + (O * MD + O);
  }
  int64_t params() const override {
    return c_.hidden_size * c_.patch_dim() + c_.depth * block() + merger();  // patch_embed.proj [D, C, T, P, P]
  }
  int64_t projector_params() const override { return 0; }  // the merger maps to the LLM's width
  std::vector<int64_t> hooked_units() const override {
    std::vector<int64_t> u(size_t(c_.depth), block());
    u.push_back(merger());
    return u;
  }
  // The processor resizes each frame to whole merge blocks (multiples of patch_size * spatial_merge_size a side)
  // within max_pixels: at most max_pixels / (P * P * M) blocks of M patches; frames are taken temporal_patch_size
  // at a time (an image is repeated to fill one).
  int64_t patches(const VisualInputs& v) const override {
    const int64_t M = c_.merge_unit(), P = c_.patch_size, T = c_.temporal_patch_size;
    return (v.frames + T - 1) / T * (v.max_pixels / (P * P * M)) * M;
  }
  int64_t pixel_elements(const VisualInputs& v) const override { return patches(v) * c_.patch_dim(); }
  std::array<int64_t, 3> grid(const VisualInputs& v) const override {
    const int64_t m = c_.spatial_merge_size, P = c_.patch_size, T = c_.temporal_patch_size;
    const int64_t blocks = v.max_pixels / (P * P * m * m);
    int64_t a = 1;
    for (int64_t d = 1; d * d <= blocks; ++d)
      if (blocks % d == 0) a = d;
    return {(v.frames + T - 1) / T, a * m, blocks / std::max<int64_t>(1, a) * m};
  }
  int64_t llm_tokens(const VisualInputs& v) const override { return patches(v) / c_.merge_unit(); }

  // Saved by one block on N patches (Qwen25VisionBlock::forward): norm1's input and rstd; qkv's input; the fp32
  // rotary of q and k (each saves its fp32 copy and rotate_half of it); SDPA's q, k, v (gathered per window), output
  // and fp32 log-sum-exp [H, N]; the window indices (int64, gather and index_copy); proj's input; norm2's input and
  // rstd; gate/up's shared input; SiLU's input, the product's two factors, down_proj's input.
  int64_t block_saved(int64_t N, int64_t e) const {
    const int64_t D = c_.hidden_size, F = c_.intermediate_size, H = c_.num_heads;
    return e * N * (9 * D + 4 * F) + 2 * 2 * 4 * N * D + 2 * 4 * N + 4 * H * N + 2 * 8 * N;
  }
  TowerActivations activations(int64_t inputs, const VisualInputs& v, int64_t e, bool train,
                               bool checkpointing) const override {
    TowerActivations a;
    if (!train || inputs <= 0) return a;
    const int64_t N = inputs * patches(v), D = c_.hidden_size, F = c_.intermediate_size;
    const int64_t stem = e * N * c_.patch_dim() + 2 * 4 * N * c_.head_dim();  // conv3d input; rotary cos, sin fp32
    const int64_t merger_saved = 4 * e * N * D + 4 * N;  // ln_q input + rstd, mlp.0 input, GELU input, mlp.2 input
    const int64_t unit = block_saved(N, e);
    a.largest_unit = std::max(unit, merger_saved);
    a.saved = stem + merger_saved + c_.depth * (checkpointing ? e * N * D : unit);
    // Its own backward (after the decoder's): at worst everything saved, one recomputed block, and the gradients
    // inside one block's backward (the block input's and the MLP's widest).
    a.backward_peak = a.saved + (checkpointing ? unit : 0) + e * N * (3 * D + 2 * F);
    return a;
  }

 private:
  Qwen25VisionConfig c_;
};

}  // namespace

std::unique_ptr<TowerCosts> tower_costs(const LlavaConfig& c) {
  if (c.qwen_vision) return std::make_unique<Qwen25VisionCosts>(*c.qwen_vision);
  return nullptr;
}

AnyresBound anyres_image_bound(const LlavaConfig& c) {
  if (!c.anyres || !c.vision) return {1, c.image_seq_length()};
  if (c.anyres->pinpoints.empty()) throw std::invalid_argument("AnyRes: no image_grid_pinpoints");
  const int64_t tile = c.vision->image_size, side = tile / c.vision->patch_size;
  AnyresBound b{0, 0};
  for (const auto& p : c.anyres->pinpoints) {
    const int64_t rows = p[0] / tile, cols = p[1] / tile;
    b.tiles = std::max(b.tiles, 1 + rows * cols);
    b.tokens = std::max(b.tokens, side * side + rows * side * (cols * side + 1));
  }
  // LLaVA-OneVision: anyres_max_N caps the grid, so the whole largest grid is far above what an image takes.
  if (c.anyres->max_patches > 0)
    b.tokens = anyres_max_image_tokens(*c.anyres, static_cast<int>(tile), static_cast<int>(side));
  return b;
}

}  // namespace gmod

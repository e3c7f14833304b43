// The native-resolution encoders (Qwen2.5-VL, Qwen3-VL) as the memory plan counts them; each term names what
// it mirrors in model/qwen2_5_vl_vision.cpp or model/qwen3_vl_vision.cpp. Also the AnyRes (LLaVA-NeXT) bound
// of one image's tiles and tokens. The Qwen2.5-VL activation terms are compared with measured peaks
// (tests/trainer/mpi_memory_plan_qwen_test.cpp, docs/plan.md); Qwen3-VL's are an estimate from the code, not
// yet measured.
#include "trainer/plan/tower_costs.h"

#include <algorithm>
#include <stdexcept>

namespace gmod {
namespace {

// What the processor makes of one visual input, the same for both encoders (transformers maps both to
// Qwen2VLImageProcessor): each frame resized to whole merge blocks (multiples of patch_size *
// spatial_merge_size a side) within max_pixels, at most max_pixels / (P * P * M) blocks of M patches; frames
// taken temporal_patch_size at a time (an image is repeated to fill one).
class NativeResolutionCosts : public TowerCosts {
 public:
  NativeResolutionCosts(int64_t patch, int64_t temporal, int64_t merge, int64_t patch_dim)
      : P_(patch), T_(temporal), m_(merge), patch_dim_(patch_dim) {}
  int64_t patches(const VisualInputs& v) const override {
    const int64_t M = m_ * m_;
    return (v.frames + T_ - 1) / T_ * (v.max_pixels / (P_ * P_ * M)) * M;
  }
  int64_t pixel_elements(const VisualInputs& v) const override { return patches(v) * patch_dim_; }
  std::array<int64_t, 3> grid(const VisualInputs& v) const override {
    const int64_t blocks = v.max_pixels / (P_ * P_ * m_ * m_);
    int64_t a = 1;
    for (int64_t d = 1; d * d <= blocks; ++d)
      if (blocks % d == 0) a = d;
    return {(v.frames + T_ - 1) / T_, a * m_, blocks / std::max<int64_t>(1, a) * m_};
  }
  int64_t llm_tokens(const VisualInputs& v) const override { return patches(v) / (m_ * m_); }

 private:
  int64_t P_, T_, m_, patch_dim_;
};

class Qwen25VisionCosts : public NativeResolutionCosts {
 public:
  explicit Qwen25VisionCosts(const Qwen25VisionConfig& c)
      : NativeResolutionCosts(c.patch_size, c.temporal_patch_size, c.spatial_merge_size, c.patch_dim()),
        c_(c) {}

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

class Qwen3VisionCosts : public NativeResolutionCosts {
 public:
  explicit Qwen3VisionCosts(const Qwen3VisionConfig& c)
      : NativeResolutionCosts(c.patch_size, c.temporal_patch_size, c.spatial_merge_size, c.patch_dim()),
        c_(c) {}

  // One block (Qwen3VisionBlock): norm1, norm2 LayerNorms [D] weight and bias; attn.qkv [3D, D] + bias,
  // attn.proj [D, D] + bias; mlp.linear_fc1 [F, D] + bias, mlp.linear_fc2 [D, F] + bias.
  int64_t block() const {
    const int64_t D = c_.hidden_size, F = c_.intermediate_size;
    return 4 * D + (3 * D * D + 3 * D) + (D * D + D) + (F * D + F) + (D * F + D);
  }
  // A merger (Qwen3VisionMerger): its LayerNorm over one patch [D] (the merger) or over a merge block's
  // concatenated patches [MD] (a DeepStack merger, postshuffle), weight and bias; linear_fc1 [MD, MD] + bias,
  // linear_fc2 [O, MD] + bias.
  int64_t merger(bool postshuffle) const {
    const int64_t MD = c_.merge_unit() * c_.hidden_size, O = c_.out_hidden_size;
    return 2 * (postshuffle ? MD : c_.hidden_size) + (MD * MD + MD) + (O * MD + O);
  }
  int64_t levels() const { return static_cast<int64_t>(c_.deepstack_visual_indexes.size()); }
  // patch_embed.proj [D, C, T, P, P] + bias and pos_embed [num_position_embeddings, D]: not in a hooked unit.
  int64_t stem_params() const {
    return c_.hidden_size * c_.patch_dim() + c_.hidden_size + c_.num_position_embeddings * c_.hidden_size;
  }
  int64_t params() const override {
    return stem_params() + c_.depth * block() + merger(false) + levels() * merger(true);
  }
  int64_t projector_params() const override { return 0; }  // the mergers map to the LLM's width
  // As model/unit_hooks.cpp forms them, in the order they run: each block, the DeepStack merger that reads
  // it, then the merger.
  std::vector<int64_t> hooked_units() const override {
    std::vector<int64_t> u;
    const auto& idx = c_.deepstack_visual_indexes;
    for (int64_t i = 0; i < c_.depth; ++i) {
      u.push_back(block());
      if (std::find(idx.begin(), idx.end(), i) != idx.end()) u.push_back(merger(true));
    }
    u.push_back(merger(false));
    return u;
  }

  // Saved by one block on N patches (Qwen3VisionBlock::forward): norm1's input, mean and rstd; qkv's input;
  // SDPA's q, k, v (after the fp32 rotary, cast back), output (proj's input is a view of it) and fp32
  // log-sum-exp [H, N]; norm2's input, mean and rstd; linear_fc1's input, GELU's input, linear_fc2's input.
  // (The rotary's multiplications by cos / sin save only the tables, which need no gradient: counted once in
  // the stem.)
  int64_t block_saved(int64_t N, int64_t e) const {
    const int64_t D = c_.hidden_size, F = c_.intermediate_size, H = c_.num_heads;
    return e * N * (8 * D + 2 * F) + 2 * 2 * 4 * N + 4 * H * N;
  }
  // A merger on N patches: its LayerNorm's input, mean and rstd (per patch, or per merge block for a
  // DeepStack merger), linear_fc1's input, GELU's input, linear_fc2's input ([N / M, MD] each: N * D
  // elements).
  int64_t merger_saved(int64_t N, int64_t e, bool postshuffle) const {
    return 4 * e * N * c_.hidden_size + 2 * 4 * (postshuffle ? N / c_.merge_unit() : N);
  }
  TowerActivations activations(int64_t inputs, const VisualInputs& v, int64_t e, bool train,
                               bool checkpointing) const override {
    TowerActivations a;
    if (!train || inputs <= 0) return a;
    const int64_t N = inputs * patches(v), D = c_.hidden_size, F = c_.intermediate_size;
    // conv3d's input; the position taps (int64 [N, 4], embedding's backward) and their fp32 weights; the
    // rotary cos and sin (fp32 [N, head_dim] each).
    const int64_t stem = e * N * c_.patch_dim() + 8 * 4 * N + 4 * 4 * N + 2 * 4 * N * c_.head_dim();
    // Each DeepStack level: its merger's saved tensors and its output [N / M, O], held until the LLM adds it.
    const int64_t level = merger_saved(N, e, true) + e * (N / c_.merge_unit()) * c_.out_hidden_size;
    const int64_t unit = block_saved(N, e);
    a.largest_unit = std::max({unit, merger_saved(N, e, false), merger_saved(N, e, true)});
    a.saved =
        stem + merger_saved(N, e, false) + levels() * level + c_.depth * (checkpointing ? e * N * D : unit);
    // Its own backward (after the decoder's): at worst everything saved, one recomputed block, and the
    // gradients inside one block's backward (the block input's and the MLP's widest).
    a.backward_peak = a.saved + (checkpointing ? unit : 0) + e * N * (3 * D + 2 * F);
    return a;
  }

 private:
  Qwen3VisionConfig c_;
};

}  // namespace

std::unique_ptr<TowerCosts> tower_costs(const LlavaConfig& c) {
  if (c.qwen_vision) return std::make_unique<Qwen25VisionCosts>(*c.qwen_vision);
  if (c.qwen3_vision) return std::make_unique<Qwen3VisionCosts>(*c.qwen3_vision);
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

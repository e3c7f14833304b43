// The Qwen2.5-VL vision encoder (transformers' Qwen2_5_VisionTransformerPretrainedModel): images and videos
// of any patch grid, packed into one sequence of patches without padding. A patch is C x temporal_patch_size
// x P x P pixels flattened (as Qwen2.5-VL's image processor emits them); grid_thw [n, 3] gives each image's
// or video's (frames / temporal_patch_size, rows, columns) in patches, its patches consecutive in the
// processor's order (each spatial_merge_size x spatial_merge_size block of patches consecutive).
//
// Forward: patch embedding (the published Conv3d with stride = kernel: one output per patch), then
// the patches are reordered window by window (windows of window_size / patch_size patches a side, whole merge
// blocks, row-major within each frame), 2-D rotary positions (row and column of each patch, half the rotary
// frequencies each) follow them, and the RMSNorm / SwiGLU blocks attend within each window, or within each
// frame for the blocks in fullatt_block_indexes: never across frames, images or videos. The merger (RMSNorm,
// then each 2x2 block's patches concatenated through Linear-GELU-Linear) gives one feature per merge block,
// put back in the processor's order: [N_patches / merge^2, out_hidden_size], the images' tokens in grid_thw
// order.
//
// Parameter names are the published checkpoints' under `visual.`: patch_embed.proj.weight [D, C, T, P, P],
// blocks.{i}.{norm1,norm2}.weight, blocks.{i}.attn.{qkv,proj}.{weight,bias},
// blocks.{i}.mlp.{gate_proj,up_proj,down_proj}.{weight,bias}, merger.ln_q.weight,
// merger.mlp.{0,2}.{weight,bias}.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/layers.h"
#include "model/qwen2_5_vl_config.h"
#include "model/vision_tower.h"

namespace gmod {

class SafetensorsFile;

// Bidirectional attention within consecutive segments of a packed sequence (no padding): q, k, v [N, H, Dh], the
// segments' lengths summing to N (zero-length ones skipped) -> [N, H, Dh]. Segments of equal length run as one SDPA
// batch. `who` names the caller in the error when the lengths do not cover N. Qwen2.5-VL's windows and frames,
// Qwen3-VL's frames (model/qwen3_vl_vision.h).
at::Tensor vision_segment_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const std::vector<int64_t>& segments, double scale, const std::string& who);

// Hugging Face's rotate_half over the last axis, (x1, x2) -> (-x2, x1): the Qwen vision encoders' 2-D rotary.
at::Tensor vision_rotate_half(const at::Tensor& x);

// The patch order the encoder attends in and the segments it attends within, for one grid_thw. Plain
// integers: computed on the CPU, no autograd.
struct Qwen25VisionLayout {
  at::Tensor window_index;              // [N / merge^2] int64: merge block taken at each windowed position
  at::Tensor unwindow;                  // [N / merge^2] int64: its inverse permutation
  at::Tensor positions;                 // [N, 2] int64: (row, column) of each patch, in the processor's order
  std::vector<int64_t> window_lengths;  // patches per window (windowed order), empty windows left out
  std::vector<int64_t> frame_lengths;   // patches per frame (full attention segments)
  static Qwen25VisionLayout of(const at::Tensor& grid_thw, const Qwen25VisionConfig& c);
};

class Qwen25VisionBlock : public torch::nn::Module {
 public:
  explicit Qwen25VisionBlock(const Qwen25VisionConfig& c);
  // x [N, D] in windowed order; cos, sin [N, head_dim] fp32; attention within consecutive `segments`.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const std::vector<int64_t>& segments);

  std::shared_ptr<torch::nn::Module> attn, mlp;
  std::shared_ptr<RMSNormImpl> norm1, norm2;
  std::shared_ptr<LinearImpl> qkv, proj, gate_proj, up_proj, down_proj;
  int64_t n_heads, head_dim;
  bool silu;
};

// The merger (`merger.`): RMSNorm ln_q, then each merge block's patches concatenated through mlp.0 - GELU -
// mlp.2. A unit of its own (model/unit_hooks.h) after the blocks.
class Qwen25VisionMerger : public torch::nn::Module {
 public:
  explicit Qwen25VisionMerger(const Qwen25VisionConfig& c);
  // h [N, D] in windowed order -> [N / merge^2, out_hidden_size], still windowed.
  at::Tensor forward(const at::Tensor& h);

  std::shared_ptr<RMSNormImpl> ln_q;
  std::shared_ptr<LinearImpl> fc1, fc2;
  int64_t unit;
};

// As the model's vision tower (MultimodalLM's `vision.`): token_features() with grid_thw; no projector
// follows.
class Qwen25VisionEncoder : public VisionTower {
 public:
  explicit Qwen25VisionEncoder(const Qwen25VisionConfig& c);
  at::Tensor features(const at::Tensor& pixel_values) override;  // throws: needs grid_thw
  at::Tensor token_features(const at::Tensor& pixel_values, const at::Tensor& grid_thw) override {
    return features(pixel_values, grid_thw);
  }
  int64_t feature_dim() const override { return config.out_hidden_size; }
  int64_t tokens_per_image() const override { return 0; }
  int image_size() const override { return 0; }
  bool projects_to_text() const override { return true; }
  // transformers' _init_weights of Qwen2_5_VisionTransformerPretrainedModel: every RMSNorm weight 1, the merger's
  // ln_q included (MultimodalLM's default would draw it as a weight, its name holding no "norm"); the rest is the
  // default (Conv3d and Linear weights normal(0, vision initializer_range), biases 0).
  bool init_parameter(const std::string& name, at::Tensor& t, at::Generator& gen) const override;
  // pixel_values [N, C*T*P*P], grid_thw [n, 3] int64 -> [N / merge^2, out_hidden_size] in the parameter
  // dtype.
  at::Tensor features(const at::Tensor& pixel_values, const at::Tensor& grid_thw);
  // Tokens each grid entry gives the LLM: t * h * w / merge^2.
  int64_t tokens_of(int64_t t, int64_t h, int64_t w) const { return t * h * w / config.merge_unit(); }
  // Copies every parameter from `file`'s tensors named prefix + parameter name (e.g. "visual."); a missing or
  // mis-shaped tensor throws naming the file and the tensor.
  void load(const SafetensorsFile& file, const std::string& prefix);

  // Units (model/unit_hooks.h: ZeRO-3 gathers around them): each block, then the merger. Blocks are recomputed in
  // the backward with set_activation_checkpointing(true); the merger is not.
  Qwen25VisionConfig config;
  at::Tensor patch_embed;  // [D, C, T, P, P]
  std::vector<std::shared_ptr<Qwen25VisionBlock>> blocks;
  std::shared_ptr<Qwen25VisionMerger> merger;
};

}  // namespace gmod

// The Qwen3-VL vision encoder (transformers' Qwen3VLVisionModel): images of any patch grid, packed into one
// sequence of patches without padding. A patch is C x temporal_patch_size x P x P pixels flattened (as the image
// processor emits them); grid_thw [n, 3] gives each image's (frames / temporal_patch_size, rows, columns) in
// patches, its patches consecutive in the processor's order (each spatial_merge_size^2 block of patches
// consecutive, blocks row-major).
//
// Forward: patch embedding (Conv3d with bias, stride = kernel), plus the learned position embeddings
// (pos_embed [side^2, D], side = sqrt(num_position_embeddings)) resampled bilinearly (align_corners) from the
// side x side grid to each image's rows x columns; 2-D rotary (row and column of each patch, half the rotary
// frequencies each); LayerNorm / GELU-MLP blocks with full attention within each frame of each image (never
// across images). After the blocks in deepstack_visual_indexes a DeepStack merger (LayerNorm over each merge
// block's concatenated patches, then Linear-GELU-Linear) gives features of the image tokens that the LLM adds to
// its first layers' hidden states (ForwardState::deepstack); after the last block the merger (LayerNorm over each
// patch, then the same MLP) gives the image tokens' embeddings. Both [N / merge^2, out_hidden_size], in the
// processor's order.
//
// Parameter names are the checkpoints' under `model.visual.`: patch_embed.proj.{weight,bias}, pos_embed.weight,
// blocks.{i}.{norm1,norm2}.{weight,bias}, blocks.{i}.attn.{qkv,proj}.{weight,bias},
// blocks.{i}.mlp.{linear_fc1,linear_fc2}.{weight,bias}, merger.{norm,linear_fc1,linear_fc2}.{weight,bias},
// deepstack_merger_list.{j}.{norm,linear_fc1,linear_fc2}.{weight,bias}.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/clip.h"
#include "model/layers.h"
#include "model/qwen3_vl_config.h"
#include "model/vision_tower.h"

namespace gmod {

// Per patch (processor order) the four taps into the flattened position grid and their bilinear weights, as
// F.interpolate(mode="bilinear", align_corners=True) resamples side x side to each image's h x w; and the (row,
// column) of each patch. Computed on the CPU in fp32.
struct Qwen3VisionPositions {
  at::Tensor taps;       // [N, 4] int64
  at::Tensor weights;    // [N, 4] fp32
  at::Tensor rows_cols;  // [N, 2] int64
  std::vector<int64_t> frame_lengths;  // patches per frame (the attention segments)
  static Qwen3VisionPositions of(const at::Tensor& grid_thw, const Qwen3VisionConfig& c);
};

class Qwen3VisionBlock : public torch::nn::Module {
 public:
  explicit Qwen3VisionBlock(const Qwen3VisionConfig& c);
  // x [N, D]; cos, sin [N, head_dim] fp32; attention within consecutive `segments`.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const std::vector<int64_t>& segments);

  std::shared_ptr<torch::nn::Module> attn, mlp;
  std::shared_ptr<LayerNormImpl> norm1, norm2;
  std::shared_ptr<LinearImpl> qkv, proj, fc1, fc2;
  int64_t n_heads, head_dim;
  bool tanh_gelu;
};

// The merger (`merger.`, postshuffle false: LayerNorm over each patch) or a DeepStack merger
// (`deepstack_merger_list.{j}.`, postshuffle true: LayerNorm over each merge block's concatenated patches).
class Qwen3VisionMerger : public torch::nn::Module {
 public:
  Qwen3VisionMerger(const Qwen3VisionConfig& c, bool postshuffle);
  at::Tensor forward(const at::Tensor& h);  // [N, D] -> [N / merge^2, out_hidden_size]

  std::shared_ptr<LayerNormImpl> norm;
  std::shared_ptr<LinearImpl> fc1, fc2;
  int64_t unit;
  bool postshuffle;
};

class Qwen3VisionEncoder : public VisionTower {
 public:
  explicit Qwen3VisionEncoder(const Qwen3VisionConfig& c);
  at::Tensor features(const at::Tensor& pixel_values) override;  // throws: needs grid_thw
  at::Tensor token_features(const at::Tensor& pixel_values, const at::Tensor& grid_thw) override {
    return features(pixel_values, grid_thw, nullptr);
  }
  at::Tensor token_features_stacked(const at::Tensor& pixel_values, const at::Tensor& grid_thw,
                                    std::vector<at::Tensor>& deepstack) override {
    return features(pixel_values, grid_thw, &deepstack);
  }
  int64_t feature_dim() const override { return config.out_hidden_size; }
  int64_t tokens_per_image() const override { return 0; }
  int image_size() const override { return 0; }
  bool projects_to_text() const override { return true; }
  // pixel_values [N, C*T*P*P], grid_thw [n, 3] int64 -> [N / merge^2, out_hidden_size] in the parameter dtype; with
  // `deepstack`, one tensor of that shape per deepstack_visual_indexes entry is appended to it.
  at::Tensor features(const at::Tensor& pixel_values, const at::Tensor& grid_thw, std::vector<at::Tensor>* deepstack);
  int64_t tokens_of(int64_t t, int64_t h, int64_t w) const { return t * h * w / config.merge_unit(); }

  // Units (model/unit_hooks.h): each block, then each DeepStack merger where it runs, then the merger. Blocks are
  // recomputed in the backward with set_activation_checkpointing(true).
  Qwen3VisionConfig config;
  at::Tensor patch_weight, patch_bias;  // [D, C, T, P, P], [D]
  at::Tensor pos_embed;                 // [side^2, D]
  std::vector<std::shared_ptr<Qwen3VisionBlock>> blocks;
  std::shared_ptr<Qwen3VisionMerger> merger;
  std::vector<std::shared_ptr<Qwen3VisionMerger>> deepstack_mergers;
};

}  // namespace gmod

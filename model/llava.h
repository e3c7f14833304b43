// The LLaVA-style multimodal LM: vision tower (model/vision_tower.h) -> mlp2x_gelu projector -> LLaMA decoder
// -> LM head. Image features replace the image-token positions of the (already expanded) input ids, so
// any number of images per batch and text-only samples mix freely. Parameter names:
//   llm.embed_tokens.weight, llm.layers.{i}.*, llm.norm.weight, lm_head.weight,
//   vision.* (the tower's own names, e.g. CLIP's vision.vision_model.*), projector.linear_{1,2}.*,
//   image_newline (LLaVA-NeXT)
#pragma once

#include "model/llama.h"
#include "model/vision_tower.h"

namespace gmod {

class ProjectorImpl : public torch::nn::Module {
 public:
  ProjectorImpl(int64_t vision_dim, int64_t text_dim);
  at::Tensor forward(const at::Tensor& x) const { return linear_2->forward(at::gelu(linear_1->forward(x))); }
  std::shared_ptr<LinearImpl> linear_1, linear_2;
};

struct ModelInputs {
  at::Tensor input_ids;       // [B, L] int64, images expanded to image_seq_length() image tokens each
  at::Tensor pixel_values;    // [N_images, 3, S, S] in the order the images occur; undefined if none
                              // (Qwen2.5-VL: the images' patches [N_patches, C*T*P*P], with image_grid_thw)
  at::Tensor image_sizes;     // [N_images, 2] int64 (height, width) of each original image, for AnyRes models
                              // (LLaVA-NeXT): pixel_values then holds every image's tiles [N_tiles, 3, S, S],
                              // image by image, the base image first (data/anyres.h)
  at::Tensor image_grid_thw;  // [N_images, 3] int64 patch grid of each image, for towers of variable grids; the
                              // M-RoPE positions of the batch follow from it (model/mrope.h)
  // Videos (Qwen2.5-VL): their patches [N_video_patches, C*T*P*P] as the processor lays them out, video by video in
  // the order their <|video_pad|> runs occur; each video's grid [N_videos, 3]; and its seconds per temporal grid step
  // [N_videos] float32 (undefined: 1 s). The encoder takes them in one pass with the images, and M-RoPE steps their
  // frames by tokens_per_second * second_per_grid_ts.
  at::Tensor pixel_values_videos;
  at::Tensor video_grid_thw;
  at::Tensor second_per_grid_ts;
  at::Tensor attention_mask;  // [B, L] bool, true = real token; undefined = no padding
  at::Tensor labels;          // [B, L] int64 with -100 = ignored; undefined = no loss
  at::Tensor positions;       // [B, L] int64, or [3, B, L] for M-RoPE models; undefined = 0..L-1 (M-RoPE with
                              // images: model/mrope.h's ids from image_grid_thw)
  at::Tensor token_roles;     // [B, L] int8 TokenRole (for MoD routing); optional
  at::Tensor host_role_counts;  // [B, 4] int64 CPU count_routing_roles(token_roles, attention_mask); optional
                                // (packed rows: [S, 4] count_segment_roles)
  // Packed rows (data.pack_to): the samples each row holds (model/segments.h); null = one sample per row. With it,
  // `positions` restart per segment (SegmentLayout::positions) and every segment's first label is -100, so no
  // position predicts the next segment's first token.
  std::shared_ptr<const SegmentLayout> segments;
};

struct ModelOutput {
  at::Tensor logits;   // [B, L, V] fp32
  at::Tensor lm_loss;  // scalar mean over supervised tokens (when labels were given)
  at::Tensor lm_loss_sum;
  int64_t supervised_tokens = 0;
};

class MultimodalLM : public torch::nn::Module {
 public:
  explicit MultimodalLM(const LlavaConfig& c);

  // Embeddings with image features spliced in: [B, L, D]. `grid_thw`: ModelInputs::image_grid_thw;
  // `image_sizes`: ModelInputs::image_sizes.
  // `pixel_values_videos` / `video_grid_thw`: ModelInputs' videos, spliced in at the video token's positions.
  // `deepstack` (DeepStack towers, Qwen3-VL): receives the tower's DeepStack features of the image and video
  // tokens (VisionTower::token_features_stacked) in the order of visual_positions(), which the LLM adds to
  // its first layers (ForwardState::deepstack).
  at::Tensor embed_inputs(const at::Tensor& input_ids, const at::Tensor& pixel_values,
                          const at::Tensor& grid_thw = {}, const at::Tensor& image_sizes = {},
                          const at::Tensor& pixel_values_videos = {}, const at::Tensor& video_grid_thw = {},
                          std::vector<at::Tensor>* deepstack = nullptr);
  // The positions that take visual features [B, L] bool: the image token's, and the video token's in a model
  // with videos (M-RoPE). DeepStack's features follow them in sequence order (ForwardState::visual_mask).
  at::Tensor visual_positions(const at::Tensor& input_ids) const;
  // Throws a named std::invalid_argument (count, first id, sample and position) when an id that is not an image
  // position (`is_img`) lies outside [0, vocab_size). embed_inputs calls it: every command's forward is covered.
  void check_token_ids(const at::Tensor& input_ids, const at::Tensor& is_img) const;
  // Projected image features [N_images, image_seq_length, D].
  at::Tensor image_features(const at::Tensor& pixel_values);
  // Projected features of every image-token position, in order: [sum of tokens, D] (towers of variable grids).
  at::Tensor image_token_features(const at::Tensor& pixel_values, const at::Tensor& grid_thw,
                                  const at::Tensor& image_sizes = {}, std::vector<at::Tensor>* deepstack = nullptr);
  // The decoder's final-normed hidden states [B, L, D] for `in` (ForwardState prepared here, M-RoPE positions
  // included).
  at::Tensor hidden_states(const ModelInputs& in, ForwardState& st);
  // hidden_states' first part, for callers that run the decoder's layers themselves (ARank): `st` prepared as
  // the forward prepares it (positions, masks, M-RoPE ids, DeepStack features and their positions) and the
  // input embeddings [B, L, D] returned. Then LlamaModel::prepare_rotary, each layer,
  // LlamaModel::add_deepstack.
  at::Tensor decoder_inputs(const ModelInputs& in, ForwardState& st);
  // Full forward. `st` may request attention maps; routing layers report into it.
  ModelOutput forward(const ModelInputs& in, ForwardState& st);
  ModelOutput forward(const ModelInputs& in) {
    ForwardState st;
    return forward(in, st);
  }
  // Hidden states -> logits (fp32).
  at::Tensor logits(const at::Tensor& hidden) const;
  const at::Tensor& lm_head_weight() const { return config.text.tie_word_embeddings ? llm->embed_tokens : lm_head; }

  // Random initialisation as transformers does (normal(0, initializer_range), norms = 1, biases = 0); only the
  // parameters whose names start with `prefix` when it is not empty.
  void init_weights(uint64_t seed, const std::string& prefix = "");

  LlavaConfig config;
  std::shared_ptr<LlamaModel> llm;
  at::Tensor lm_head;  // [V, D]; undefined when tied
  std::shared_ptr<VisionTower> vision;  // nullptr: text-only
  std::shared_ptr<ProjectorImpl> projector;  // nullptr when the tower projects to the LLM itself (Qwen2.5-VL)
  at::Tensor image_newline;  // [D] LLaVA-NeXT's row end of the tile grid (model/llava_next.h); undefined otherwise
};

// Shifted next-token cross-entropy (fp32), ignore_index -100. Returns (sum, count).
std::pair<at::Tensor, int64_t> causal_lm_loss_sum(const at::Tensor& logits, const at::Tensor& labels);

// Fills ForwardState's positions and masks for a fresh (non-cached) forward pass.
void prepare_forward_state(ForwardState& st, const at::Tensor& input_ids, const at::Tensor& attention_mask,
                           const at::Tensor& positions);
// The same for a full forward of `in`, with what routing layers read: token roles, host role counts (counted here
// when `in` has none) and the packed-row layout.
void prepare_forward_state(ForwardState& st, const ModelInputs& in);

}  // namespace gmod

// One LLM decoder layer behind a small interface, so that mod/ can swap a dense layer for a
// Mixture-of-Depths layer without the model knowing about routing. `ForwardState` carries what all
// layers of one forward pass share (positions, masks, rotary tables) and what they report back
// (attention maps for ARank, auxiliary losses, tokens processed per layer).
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <vector>

#include "model/layers.h"

namespace gmod {

struct LayerTokens {
  int layer;
  int64_t processed;  // token positions this layer ran attention+MLP on (valid tokens only)
  int64_t total;      // valid token positions that entered the layer
  int64_t attn_pairs = -1;  // causal query-key pairs computed, summed over samples; -1 = not reported (dense)
  int64_t routable = -1;    // valid tokens the layer was allowed to skip (MoD layers); -1 = not a routing layer
};

// Per-sample token counts that MoD capacities and accounting depend on, known on the host: [B, 4] int64 on the CPU,
// columns kCountValid (real tokens: key_valid and role != pad), kCountImageSystem, kCountAnswer, kCountImage (real
// tokens of those roles; the image count is what p-MoD's capacity needs). Undefined roles: only kCountValid is filled. One device-to-host copy when the inputs live on an
// accelerator (none on the CPU); the data pipeline can hand it over precomputed (ModelInputs::host_role_counts).
enum HostCountColumn : int64_t { kCountValid = 0, kCountImageSystem = 1, kCountAnswer = 2, kCountImage = 3 };
constexpr int64_t kHostCountColumns = 4;
at::Tensor count_routing_roles(const at::Tensor& token_roles, const at::Tensor& key_valid, int64_t B, int64_t L);
// The same per segment of packed rows: [S, 4] (token_roles and key_valid [B, L] as above; layout model/segments.h).
at::Tensor count_segment_roles(const at::Tensor& token_roles, const at::Tensor& key_valid, int64_t B, int64_t L,
                               const SegmentLayout& layout);

// How a routing block treats its data-dependent token selection in this pass (activation checkpointing,
// model/activation_checkpoint.h): kRecord stores it in ForwardState::routing_selection, kReplay takes it from there
// instead of routing again, so the recomputed forward processes exactly the tokens of the first pass.
enum class RoutingPass { kNormal, kRecord, kReplay };

struct ForwardState {
  const RotaryEmbedding* rope = nullptr;
  at::Tensor positions;    // [B, L] int64 absolute positions of the current tokens
  at::Tensor key_valid;    // [B, L] bool, true = real token; undefined = no padding
  at::Tensor token_roles;  // [B, L] int8 TokenRole; undefined when unknown (MoD then routes nothing)
  at::Tensor host_role_counts;  // [B|S, 4] int64 CPU (count_routing_roles); undefined = MoD layers count themselves
  at::Tensor cos, sin;     // [B|1, L, Dh] rotary tables for `positions` (or for mrope_positions)
  // [3, B, L] int64 (temporal, height, width) for M-RoPE models (LlamaConfig::mrope_section) when the batch has
  // images; the rotary tables then come from these. Undefined: the tables come from `positions` (also M-RoPE's with
  // equal axes, i.e. text only).
  at::Tensor mrope_positions;
  // Qwen3-VL's DeepStack: after decoder layer j < deepstack.size(), deepstack[j] [n_visual, D] is added to the
  // hidden states at the positions where visual_mask [B, L] (bool) is true, in row-major order. Empty: none.
  std::vector<at::Tensor> deepstack;
  at::Tensor visual_mask;
  AttentionMask mask;      // full-sequence mask (undefined `allowed` = plain causal; `segments` for packed rows)
  // Packed rows (model/segments.h; also in `mask`): then host_role_counts has one row per segment, and MoD layers
  // route each segment as its own sample. segment_index / segment_slots: its view_index on the batch's device.
  std::shared_ptr<const SegmentLayout> segments;
  at::Tensor segment_index, segment_slots;
  std::vector<KVCache>* caches = nullptr;  // one per layer during generation

  bool want_attn_probs = false;
  std::vector<at::Tensor> attn_probs;  // per layer [B, H, L, L] fp32 (only when requested)
  std::vector<at::Tensor> aux_losses;  // e.g. per-MoD-layer routing losses (scalar tensors)
  std::vector<LayerTokens> tokens;     // per layer accounting
  int64_t valid_tokens = 0;            // number of real tokens in the batch
  at::Tensor routing_scores;           // [B, L] fp32 left by a layer for the next attention-routed (A-MoD) layer
  RoutingPass routing_pass = RoutingPass::kNormal;
  at::Tensor routing_selection;  // [B, L] bool: written in kRecord, read in kReplay
};

class DecoderBlock : public torch::nn::Module {
 public:
  // h [B, L, D] -> [B, L, D].
  virtual at::Tensor forward(const at::Tensor& h, ForwardState& st, int layer_idx) = 0;
  virtual bool is_mod() const { return false; }
  // Parameters the forward uses that are registered elsewhere (γ-MoD's router shared by every MoD layer), so that
  // a checkpointed block can return their gradients too.
  virtual std::vector<at::Tensor> external_parameters() const { return {}; }
};

// The standard pre-norm LLaMA layer: h + attn(norm(h)), then + mlp(norm(.)).
class DenseDecoderLayer : public DecoderBlock {
 public:
  explicit DenseDecoderLayer(const LlamaConfig& c);
  at::Tensor forward(const at::Tensor& h, ForwardState& st, int layer_idx) override;

  std::shared_ptr<RMSNormImpl> input_layernorm, post_attention_layernorm;
  std::shared_ptr<AttentionImpl> self_attn;
  std::shared_ptr<MLPImpl> mlp;
};

// Ordered container of decoder blocks whose children are named "0", "1", ... (so parameter names
// read "layers.3.self_attn.q_proj.weight"); a block can be replaced in place.
class BlockStack : public torch::nn::Module {
 public:
  void push_back(std::shared_ptr<DecoderBlock> b);
  void set(size_t i, std::shared_ptr<DecoderBlock> b);
  size_t size() const { return blocks_.size(); }
  const std::shared_ptr<DecoderBlock>& operator[](size_t i) const { return blocks_.at(i); }

 private:
  std::vector<std::shared_ptr<DecoderBlock>> blocks_;
};

}  // namespace gmod

// The LLaMA-family decoder stack (embeddings, decoder blocks, final norm), without the LM head.
#pragma once

#include "model/activation_checkpoint.h"
#include "model/decoder_layer.h"
#include "model/mrope.h"

#include <optional>

namespace gmod {

class LlamaModel : public torch::nn::Module {
 public:
  explicit LlamaModel(const LlamaConfig& c);
  // inputs_embeds [B, L, D] -> final-normed hidden states [B, L, D]. `st` must hold positions
  // (and masks); this fills the rotary tables.
  at::Tensor forward(const at::Tensor& inputs_embeds, ForwardState& st);
  // forward's steps, for callers that run the layers one by one (ARank): the rotary tables of `st`'s
  // positions (1-D, or ForwardState::mrope_positions) for `inputs_embeds`' dtype; after layer `layer`, `h`
  // with that DeepStack level's features added at ForwardState::visual_mask (unchanged past the levels or
  // without DeepStack).
  void prepare_rotary(const at::Tensor& inputs_embeds, ForwardState& st);
  at::Tensor add_deepstack(const at::Tensor& h, const ForwardState& st, size_t layer) const;
  // Lookups of `padding_idx` give that row no gradient, as transformers' nn.Embedding(vocab, hidden, pad_token_id)
  // in LlamaModel (the row still gets the tied LM head's gradient). The pad id is often a real token of the text
  // (SmolLM2 pads with <|im_end|>, which ends every turn), so this is visible in training.
  at::Tensor embed(const at::Tensor& ids) const { return at::embedding(embed_tokens, ids, padding_idx); }

  LlamaConfig config;
  RotaryEmbedding rope;
  std::optional<MRotaryEmbedding> mrope;  // config.mrope_section set: the tables of ForwardState::mrope_positions
  at::Tensor embed_tokens;  // [V, D] (registered as "embed_tokens.weight")
  int64_t padding_idx = -1;  // config.pad_token_id (negative ids count from the end, as nn.Embedding); -1: none
  std::shared_ptr<BlockStack> layers;
  std::shared_ptr<RMSNormImpl> norm;
  // Decoder layers whose activations are recomputed in the backward (training memory; model/activation_checkpoint.h).
  ActivationCheckpointing activation_checkpointing;

 private:
  std::shared_ptr<torch::nn::Module> embed_holder_;
};

}  // namespace gmod

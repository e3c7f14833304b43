// The LLaMA-family decoder stack (embeddings, decoder blocks, final norm), without the LM head.
#pragma once

#include "model/activation_checkpoint.h"
#include "model/decoder_layer.h"

namespace gmod {

class LlamaModel : public torch::nn::Module {
 public:
  explicit LlamaModel(const LlamaConfig& c);
  // inputs_embeds [B, L, D] -> final-normed hidden states [B, L, D]. `st` must hold positions
  // (and masks); this fills the rotary tables.
  at::Tensor forward(const at::Tensor& inputs_embeds, ForwardState& st);
  // As transformers' nn.Embedding(padding_idx = pad_token_id): the pad token's row gets no gradient (positions
  // holding it, e.g. left padding whose last logits predict the first real token, do not train it).
  at::Tensor embed(const at::Tensor& ids) const {
    const int64_t pad = config.pad_token_id && *config.pad_token_id >= 0 && *config.pad_token_id < config.vocab_size
                            ? *config.pad_token_id
                            : -1;
    return at::embedding(embed_tokens, ids, pad);
  }

  LlamaConfig config;
  RotaryEmbedding rope;
  at::Tensor embed_tokens;  // [V, D] (registered as "embed_tokens.weight")
  std::shared_ptr<BlockStack> layers;
  std::shared_ptr<RMSNormImpl> norm;
  // Decoder layers whose activations are recomputed in the backward (training memory; model/activation_checkpoint.h).
  ActivationCheckpointing activation_checkpointing;

 private:
  std::shared_ptr<torch::nn::Module> embed_holder_;
};

}  // namespace gmod

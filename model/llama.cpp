#include "model/llama.h"

#include <stdexcept>
#include <string>
#include <tuple>

#include "model/trace_range.h"
#include "model/unit_hooks.h"

namespace gmod {

namespace {
// Holds one tensor under the name "weight" so the parameter reads "embed_tokens.weight".
class EmbeddingHolder : public torch::nn::Module {
 public:
  EmbeddingHolder(int64_t v, int64_t d) { weight = register_parameter("weight", at::empty({v, d})); }
  at::Tensor weight;
};
}  // namespace

LlamaModel::LlamaModel(const LlamaConfig& c) : config(c), rope(c.dim_per_head(), c.rope_theta, c.rope_scaling) {
  if (c.pad_token_id) {
    const int64_t pad = *c.pad_token_id, V = c.vocab_size;
    // nn.Embedding's rule: padding_idx in [-V, V), a negative one counting from the end.
    if (pad >= V || pad < -V)
      throw std::invalid_argument("LLaMA config: pad_token_id " + std::to_string(pad) +
                                  " is outside the embedding (vocab_size " + std::to_string(V) + ")");
    padding_idx = pad < 0 ? V + pad : pad;
  }
  auto holder = std::make_shared<EmbeddingHolder>(c.vocab_size, c.hidden_size);
  embed_tokens = holder->weight;
  embed_holder_ = register_module("embed_tokens", holder);
  layers = register_module("layers", std::make_shared<BlockStack>());
  for (int i = 0; i < c.num_hidden_layers; ++i) layers->push_back(std::make_shared<DenseDecoderLayer>(c));
  norm = register_module("norm", std::make_shared<RMSNormImpl>(c.hidden_size, c.rms_norm_eps));
  if (!c.mrope_section.empty()) mrope.emplace(c.dim_per_head(), c.rope_theta, c.mrope_section, c.mrope_interleaved);
}

void LlamaModel::prepare_rotary(const at::Tensor& inputs_embeds, ForwardState& st) {
  st.rope = &rope;
  if (st.mrope_positions.defined() && !mrope)
    throw std::invalid_argument("3-D rotary positions given to a model without mrope_section");
  std::tie(st.cos, st.sin) = st.mrope_positions.defined()
                                 ? mrope->cos_sin(st.mrope_positions, inputs_embeds.scalar_type())
                                 : rope.cos_sin(st.positions, inputs_embeds.scalar_type());
}

at::Tensor LlamaModel::add_deepstack(const at::Tensor& h, const ForwardState& st, size_t layer) const {
  if (layer >= st.deepstack.size()) return h;
  // DeepStack (Qwen3-VL): the visual positions get this level's features added
  const auto m = st.visual_mask.unsqueeze(-1);
  return h + at::zeros_like(h).masked_scatter(m, st.deepstack[layer].to(h.scalar_type()));
}

at::Tensor LlamaModel::forward(const at::Tensor& inputs_embeds, ForwardState& st) {
  prepare_rotary(inputs_embeds, st);
  auto h = inputs_embeds;
  for (size_t i = 0; i < layers->size(); ++i) {
    const int idx = static_cast<int>(i);
    const auto& block = (*layers)[i];
    const TraceRange range(block->is_mod() ? "gmod::mod_layer" : "gmod::decoder_layer");
    h = run_unit(*block, [&] {
      return activation_checkpointing.applies(idx) ? checkpointed_forward(block, h, st, idx) : block->forward(h, st, idx);
    });
    h = add_deepstack(h, st, i);
  }
  return norm->forward(h);
}

}  // namespace gmod

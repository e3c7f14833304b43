// LoRA (Hu et al. 2021) on the LLM's linear layers, as PEFT's LoraLayer computes it:
//   y = x W^T (+ b) + scale * B(A(dropout(x))),  scale = alpha / r,  A [r, in], B [out, r].
// The adapters are registered on the linear they adapt, as "lora_A" / "lora_B" (so their names read
// llm.layers.3.self_attn.q_proj.lora_A.weight, which is PEFT's key once the HF prefix is mapped:
// base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight) next to a parameter-free "lora_adapter"
// module that carries scale, dropout and the adapter's index. The decoder's projections are called through
// lora_linear(), which adds the update when an adapter is attached.
//
// Dropout (on the adapter's input, as PEFT) is drawn from a generator seeded by (run seed, rank, forward
// pass, adapter index) on the input's device, not from the global generator: the recompute of an activation-
// checkpointed layer (model/activation_checkpoint.h) runs in the same pass with the same input shape and
// therefore draws exactly the first pass's mask, and a resumed run draws what the uninterrupted one drew.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "model/layers.h"
#include "model/lora_config.h"

namespace gmod {

class MultimodalLM;

// Which pass the adapters' dropout belongs to; shared by every adapter of a model. The trainer sets `pass`
// before each micro-batch's forward (to a number unique over the run, e.g. step * accumulation +
// micro-batch).
struct LoraDropoutStream {
  uint64_t seed = 0;
  int64_t pass = 0;
};

// The parameter-free half of an adapter, registered on the adapted linear as "lora_adapter".
class LoraAdapterImpl : public torch::nn::Module {
 public:
  LoraAdapterImpl(std::shared_ptr<LinearImpl> a, std::shared_ptr<LinearImpl> b, double scale, double dropout,
                  int64_t index, std::shared_ptr<LoraDropoutStream> stream);
  // The update scale * B(A(dropout(x))) for x [..., in] -> [..., out].
  at::Tensor delta(const at::Tensor& x) const;

  std::shared_ptr<LinearImpl> lora_A, lora_B;  // registered on the adapted linear, not here
  double scale, dropout;
  int64_t index;
  std::shared_ptr<LoraDropoutStream> stream;
};

// l.forward(x) plus the LoRA update when an adapter is attached to `l`.
at::Tensor lora_linear(const LinearImpl& l, const at::Tensor& x);
// The adapter attached to `l`, or nullptr.
std::shared_ptr<LoraAdapterImpl> lora_adapter_of(const LinearImpl& l);

// What attach_lora did: the adapted modules (gmod names, e.g. "llm.layers.0.self_attn.q_proj") in order, and
// the dropout stream the trainer advances.
struct LoraAttachment {
  std::vector<std::string> modules;
  std::shared_ptr<LoraDropoutStream> stream;
  int64_t parameters = 0;  // adapter parameters in all
};

// Attaches adapters to the LLM's linears that `c.targets` match (after any MoD conversion: MoD layers keep
// the dense layer's linears), in the model's parameter dtype and device. A is initialised as PEFT's default
// (kaiming-uniform with a = sqrt(5), i.e. U(-1/sqrt(in), 1/sqrt(in))) from `init_seed`, B = 0, so the model's
// output is unchanged. Throws when a target matches nothing or the model already has adapters.
LoraAttachment attach_lora(MultimodalLM& model, const LoraConfig& c, uint64_t init_seed);

// The adapted linears of `model`: (gmod module name, linear), in module order.
std::vector<std::pair<std::string, std::shared_ptr<LinearImpl>>> lora_modules(const MultimodalLM& model);

// The dropout stream of `model`'s adapters; nullptr when it has none.
std::shared_ptr<LoraDropoutStream> lora_dropout_stream(const MultimodalLM& model);

// W += scale * B A (in fp32, rounded once to W's dtype) for every adapter, then removes the adapters: the
// model is the merged dense (or γ-MoD) model. Returns how many linears were merged.
int merge_lora(MultimodalLM& model);
// Removes the adapters without merging (the base model). Returns how many were removed.
int detach_lora(MultimodalLM& model);

// transformers' in-memory name of the LLM module `gmod_module` ("llm.layers.0.self_attn.q_proj"):
// LlamaForCausalLM and the original LLaVA code "model.layers.0.self_attn.q_proj",
// LlavaForConditionalGeneration (transformers 5) "model.language_model.layers.0.self_attn.q_proj".
// lora.targets entries match either name.
std::string hf_module_name(const MultimodalLM& model, const std::string& gmod_module);

// True for the names of adapter parameters ("...lora_A.weight" / "...lora_B.weight").
bool is_lora_parameter(const std::string& name);

}  // namespace gmod

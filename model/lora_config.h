// The `lora` section of a training config (model/lora.h builds the adapters; docs/lora.md): plain data with
// defaults, its JSON and its checks, without LibTorch, so that the run config can hold it.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace gmod {

// r = 0: no LoRA.
struct LoraConfig {
  int r = 0;             // adapter rank (LLaVA's finetune_lora.sh: 128)
  double alpha = 16.0;   // scale = alpha / r (LLaVA: 256)
  double dropout = 0.0;  // on the adapter's input while training (LLaVA: 0.05)
  // Which linear layers of the LLM get an adapter, by module name as PEFT's target_modules list: an entry
  // matches a module whose name equals it or ends with "." + entry ("q_proj" matches
  // llm.layers.*.self_attn.q_proj, "layers.0.mlp.up_proj" one layer's). "all-linear": every linear of the
  // decoder layers (LLaVA's find_all_linear_names; the projector, the LM head and MoD routers are never
  // adapted).
  std::vector<std::string> targets = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                      "gate_proj", "up_proj", "down_proj"};
  std::string bias = "none";  // PEFT's bias: only "none" (biases stay frozen)
  bool vision = false;        // adapters on the vision tower too: not built (refused)

  bool enabled() const { return r > 0; }
  double scale() const { return alpha / double(r); }
};

nlohmann::json to_json(const LoraConfig& c);
// Every problem of `c` (key first, "lora.r: ..."); empty when valid.
std::vector<std::string> check_lora_config(const LoraConfig& c);

}  // namespace gmod

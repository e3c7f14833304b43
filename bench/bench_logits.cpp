// Logits of a checkpoint for given inputs (used by tests/realmodel/check_smollm2.py to compare with
// transformers):  bench_logits MODEL_DIR inputs.safetensors out.safetensors [ADAPTER_DIR]
// inputs: input_ids [B,L] int64, attention_mask [B,L] (optional). out: logits [B,L,V] fp32. ADAPTER_DIR: a PEFT
// LoRA adapter applied unmerged (model/lora_peft.h; tests/model/check_lora_peft.py).
#include <torch/torch.h>

#include <cstdio>

#include "bench/bench_help.h"
#include "model/lora_peft.h"
#include "model/pretrained.h"
#include "model/safetensors.h"

const char* const kUsage =
    "usage: bench_logits MODEL_DIR inputs.safetensors out.safetensors [ADAPTER_DIR]\n"
    "Logits [B,L,V] fp32 of a Hugging Face dir for input_ids [B,L] (and attention_mask) of\n"
    "inputs.safetensors, for comparisons with transformers (tests/model/check_export_transformers.py,\n"
    "tests/realmodel/check_smollm2.py); with ADAPTER_DIR, a PEFT LoRA adapter on top, unmerged\n"
    "(tests/model/check_lora_peft.py).\n";

int main(int argc, char** argv) {
  if (gmod::bench_help(argc, argv, kUsage)) return 0;
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: bench_logits MODEL_DIR inputs.safetensors out.safetensors [ADAPTER_DIR]\n");
    return 2;
  }
  try {
    auto model = gmod::load_pretrained(argv[1]);
    if (argc == 5) {
      gmod::load_peft_adapter(*model, argv[4]);
      model->eval();  // no adapter dropout
    }
    gmod::SafetensorsFile in(argv[2]);
    gmod::ModelInputs mi;
    mi.input_ids = in.tensor("input_ids").to(at::kLong);
    if (in.has("attention_mask")) mi.attention_mask = in.tensor("attention_mask").to(at::kBool);
    at::NoGradGuard ng;
    auto out = model->forward(mi);
    gmod::save_safetensors(argv[3], {{"logits", out.logits.contiguous()}});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_logits: %s\n", e.what());
    return 1;
  }
  return 0;
}

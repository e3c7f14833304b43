// Logits of a checkpoint for given inputs (used by tests/realmodel/check_smollm2.py to compare with
// transformers):  bench_logits MODEL_DIR inputs.safetensors out.safetensors
// inputs: input_ids [B,L] int64, attention_mask [B,L] (optional). out: logits [B,L,V] fp32.
#include <torch/torch.h>

#include <cstdio>

#include "model/pretrained.h"
#include "model/safetensors.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: bench_logits MODEL_DIR inputs.safetensors out.safetensors\n");
    return 2;
  }
  try {
    auto model = gmod::load_pretrained(argv[1]);
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

// Shared by the memory-plan test and bench/bench_memory.cpp: a small LLaVA-style model whose activations and
// optimizer states are both significant (LLM 4 layers, hidden 128, vocab 1024; frozen 2-layer CLIP tower; one
// 16-token image per sample), and the plan inputs of a run on it.
#pragma once

#include "trainer/plan/memory_plan.h"

namespace gmod::testing {

inline LlavaConfig small_llava_config() {
  LlavaConfig c;
  c.text.vocab_size = 1024;
  c.text.hidden_size = 128;
  c.text.intermediate_size = 344;
  c.text.num_hidden_layers = 4;
  c.text.num_attention_heads = 4;
  c.text.num_key_value_heads = 4;
  c.text.max_position_embeddings = 512;
  ClipVisionConfig v;
  v.hidden_size = 64;
  v.intermediate_size = 128;
  v.num_hidden_layers = 2;
  v.num_attention_heads = 4;
  v.image_size = 32;
  v.patch_size = 8;
  c.vision = v;
  c.image_token_id = 1000;
  return c;
}

inline MemoryPlanInputs small_plan_inputs(int world, int stage, const std::string& dtype = "fp32") {
  MemoryPlanInputs in;
  in.model = small_llava_config();
  in.world = world;
  in.stage = stage;
  in.dtype = dtype;
  in.micro_batch = 4;
  in.seq_len = 128;
  in.images_per_sample = 1;
  in.supervised_fraction = 0.3;  // as a LLaVA conversation: the answers only
  in.train_vision = false;
  return in;
}

}  // namespace gmod::testing

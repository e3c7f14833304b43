// Autoregressive generation for dense and MoD models: greedy or top-p sampling from prompts
// (ModelInputs with images; right-padded batches with per-sample prompt lengths), with per-layer KV
// caches (MoD layers cache only the tokens they processed, with per-sample lengths; at a decode step only the
// samples a MoD layer processes go through its matmuls, mod/mod_decode.cpp) or by full recomputation each step
// (the reference the cached path is tested against). It runs on the stepwise decoder (mod/decode_batch.h): every
// prompt admitted at once, then one step per token until all are done; a sample that ends with EOS leaves the
// batch (its row is fed pads and counted nowhere). The caches are reserved after the prefill for every token to
// come, so that decode steps write into them in place (model/kv_cache.h).
#pragma once

#include <functional>
#include <vector>

#include "mod/accounting.h"
#include "model/llava.h"

namespace gmod {

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  bool greedy = true;          // false: sample with temperature and top-p
  double temperature = 1.0;
  double top_p = 1.0;          // nucleus: smallest set of tokens whose probability reaches top_p
  uint64_t seed = 0;
  int64_t eos_token_id = -2;   // -2: the model config's eos; -1: never stop early
  int64_t pad_token_id = 0;    // written after a sample's EOS
  bool use_cache = true;
  bool keep_logits = false;    // keep each step's next-token logits
  // Called after each step's tokens are chosen (step 0, 1, ...; next_tokens [B] int64 on the model's device,
  // pad for samples already finished). Returning false ends the generation after this step (its tokens are in
  // the result), e.g. when every request of a served batch has met its own stop. Empty: not called.
  std::function<bool(int64_t step, const at::Tensor& next_tokens)> on_step;
};

struct GenerateResult {
  at::Tensor tokens;                      // [B, T] int64; pad after a sample's EOS
  at::Tensor lengths;                     // [B] int64 tokens generated per sample (EOS included)
  std::vector<at::Tensor> step_logits;    // per step [B, V] fp32 (keep_logits)
  std::vector<LayerTokens> layer_tokens;  // every layer's report over prefill and decode (accounting)
  // Prefill and every decode step accounted against the same generation without MoD (mod/accounting.h): each
  // step's dense reference attends to the sample's whole history. Finished samples are not counted.
  ComputeReport compute;
  // Wall-clock of the generation (one device synchronisation at each boundary): the prefill up to the first
  // token's logits (caches reserved for the tokens to come included), then the decode loop (choosing every token
  // and the decode_steps forwards of one new token per sample; decode_steps = generated tokens - 1 of the longest
  // sample). Next-token time = decode_seconds / decode_steps.
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;
  int64_t decode_steps = 0;
  // K/V bytes the caches hold right after the prefill, over the batch (DecodeBatch::kv_bytes; 0 without caches);
  // measured outside the prefill time.
  int64_t prefill_kv_bytes = 0;
};

// Prompt: input_ids [B, L] with images expanded, pixel_values, attention_mask (right padding),
// token_roles (MoD routing; generated tokens get TokenRole::kAnswer). Labels are ignored. Runs without
// gradients in the model's current train/eval mode (MoD layers route by threshold in eval mode).
GenerateResult generate(MultimodalLM& model, const ModelInputs& prompt, const GenerateOptions& opt = {});

// Next tokens [B] from logits [B, V]: argmax, or temperature + top-p sampling with `gen`.
at::Tensor choose_next_tokens(const at::Tensor& logits, const GenerateOptions& opt, at::Generator& gen);

}  // namespace gmod

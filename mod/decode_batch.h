// A stepwise decoder: a running batch of rows (one sequence each) that new prompts join between decode steps
// and that finished or cancelled rows leave, for dense and MoD models (continuous batching, `gmod serve`;
// generate() is "admit every prompt, step until done" on it).
//
// The batch's state: per-layer KV caches [R, Hkv, T, Dh] (slot views, model/kv_cache.h), the key validity
// [R, W] of the dense layers' caches, each row's next RoPE position and its context for the accounting.
// - Dense layers' caches (and FastV's scoring layer) share one write column W for all rows: a step writes
// every
//   row's new K/V at slot W. A joining row's prompt K/V goes into slots [0, Lp) of its row with key_valid
//   false between Lp and W (a hole, masked as right padding is). A joiner longer than W advances the column
//   for everybody (slots [W, Lp) invalid for the others).
// - MoD layers' caches hold per-row lengths (mod/mod_decode.cpp): a joiner's kept tokens go into slots
//   [0, n) of its row and its length is set to n.
// - A released row is no longer a sequence: its fed token is a pad with key_valid false, so MoD layers never
//   process it and no layer counts it (ComputeReport, LayerTokens); dense layers still run their matmuls on
//   it until admit() puts a joiner into the row (slot reuse) or compact() drops it (one copy of every cache).
// - Memory: a joiner is admitted only when the column it needs plus the longest remaining budget of every row
//   (its own included) stays within the context (fits()); the caller keeps it waiting otherwise, and the
//   batch drains (every row released) back to empty, which resets the column. The first admission into an
//   empty batch is always taken (generate()'s case).
// - Positions are each row's own: a joiner's first fed token sits at its prompt length, whatever W is.
//   M-RoPE models (Qwen2.5-VL) prefill a prompt with images at its 3-D positions (model/mrope.h, or the
//   prompt's own [3, n, Lp] positions); its first fed token then sits at the largest id + 1, i.e. prompt length
//   + rope_delta, on all three axes (as transformers' generation: cache position + rope_deltas), and every step
//   adds 1. Generated tokens are text: equal ids on the three axes, the 1-D tables.
// - use_cache = false recomputes the whole sequence at every step (the reference the cached path is tested
//   against); it holds one admission: joining a running batch needs the caches (std::logic_error).
// FastV models join too: their scoring happens in the joiner's own prefill, and a FastV layer processes every
// decode token.
#pragma once

#include <vector>

#include "mod/accounting.h"
#include "model/llava.h"

namespace gmod {

struct DecodeBatchOptions {
  bool use_cache = true;
  int64_t context = 0;  // largest shared column W (0: the model's max_position_embeddings)
};

class DecodeBatch {
 public:
  explicit DecodeBatch(MultimodalLM& model, DecodeBatchOptions opt = {});

  struct Admitted {
    std::vector<int64_t> rows;  // the batch row of each prompt (input order)
    at::Tensor logits;          // [n, V] fp32: each prompt's first-token logits
  };
  // Prefills `prompts` (input_ids [n, Lp] with images expanded, pixel_values, attention_mask (right padding),
  // token_roles, positions optional) in their own forward and places them into free rows, or new rows. Each
  // may generate up to `max_new_tokens` tokens (max_new_tokens - 1 steps). Throws std::invalid_argument for
  // an empty prompt and std::logic_error when the batch is not empty and !fits(Lp, max_new_tokens).
  Admitted admit(const ModelInputs& prompts, int64_t max_new_tokens);
  // Whether prompts of width `prompt_width` with `max_new_tokens` could join now without the column passing
  // the context (always true for an empty batch).
  bool fits(int64_t prompt_width, int64_t max_new_tokens) const;

  // One decode step: tokens [rows()] int64 on the model's device (each active row's last token; released
  // rows' entries are ignored). Returns next-token logits [rows(), V] fp32 (released rows' are meaningless).
  at::Tensor step(const at::Tensor& tokens);
  // Frees `row` (finished or cancelled). When no active row is left the batch is reset to empty.
  void release(int64_t row);
  // Drops released rows from the batch; returns each old row's new index (-1: dropped).
  std::vector<int64_t> compact();

  int64_t rows() const { return static_cast<int64_t>(active_.size()); }
  int64_t active_rows() const;
  bool active(int64_t row) const { return active_.at(static_cast<size_t>(row)); }
  int64_t column() const { return column_; }  // W: slots of the dense layers' caches
  // Everything computed so far (prefills and steps), accounted against the same work without MoD.
  const ComputeReport& compute() const { return compute_; }
  const std::vector<LayerTokens>& layer_tokens() const { return layer_tokens_; }
  // Bytes of the K/V entries the active rows hold now, over every layer: a dense layer's valid keys of each row
  // (padding and holes not counted), a MoD, FastV or PyramidDrop layer's per-row lengths (only the tokens it
  // processed): what a cache that stores no gaps would hold. Not the buffers' size (those keep room for the tokens
  // to come). One host synchronisation per layer; 0 without caches (use_cache = false).
  int64_t kv_bytes() const;

 private:
  void reset();
  std::vector<int64_t> take_rows(int64_t n);  // free rows first, then new ones
  void place(const std::vector<KVCache>& fresh, const at::Tensor& mask, const std::vector<int64_t>& rows);
  int64_t steps_ahead() const;  // the most decode steps an active row may still take
  void reserve_ahead();
  void widen_keys(int64_t columns);  // key_buf_ to at least `columns` columns (new ones false)
  at::Tensor active_mask() const;  // [R] bool on the device
  // use_cache = false: appends the step's column to the whole sequences and runs them; the last position's
  // hidden.
  at::Tensor recompute_step(const at::Tensor& tokens, const at::Tensor& valid, const at::Tensor& step_roles,
                            ForwardState& st);

  MultimodalLM& model_;
  DecodeBatchOptions opt_;
  int64_t context_;
  at::Device device_ = at::kCPU;
  std::vector<KVCache> caches_;  // one per layer
  at::Tensor key_buf_;           // [R, C] bool; the first column_ columns are the dense caches' key validity
  int64_t column_ = 0;
  at::Tensor positions_;              // [R] int64: each row's next position
  std::vector<bool> active_;          // per row
  std::vector<int64_t> context_len_;  // per row: tokens in its history (the dense reference's context)
  std::vector<int64_t> budget_;       // per row: decode steps it may still take
  // use_cache = false: the whole sequences so far.
  at::Tensor ids_, full_mask_, full_positions_, roles_;
  at::Tensor full_mrope_;  // M-RoPE: [3, R, T] positions so far
  // The prompt's input embeddings [R, P, D] (images and videos spliced in), DeepStack features and their positions.
  at::Tensor prompt_emb_, prompt_visual_mask_;
  std::vector<at::Tensor> prompt_deepstack_;
  ComputeReport compute_;
  std::vector<LayerTokens> layer_tokens_;
};

}  // namespace gmod

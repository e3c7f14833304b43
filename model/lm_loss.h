// Label-only language-model loss: the LM head and the shifted next-token cross-entropy computed only at the
// positions that carry a label, a chunk of rows at a time, never materialising the fp32 [B, L, V] logits.
// The autograd node keeps only the selected hidden rows (a view of the decoder output's gradient path), the
// per-row log-sum-exp [N] and the targets; its backward recomputes each chunk's logits (one more head GEMM,
// ~2 N D V FLOPs) and writes the hidden-state and head-weight gradients. Peak transient: one chunk's logits
// (chunk_rows x V in fp32, plus the compute-dtype GEMM output) instead of several fp32 B x L x V tensors.
// Numerics: per row the same GEMM, fp32 log-softmax and cross-entropy as MultimodalLM::forward's full-logits
// path (model/llava.cpp, the oracle of tests/model/test_lm_loss.cpp); the loss sums per chunk; the head
// weight's gradient of several chunks is summed in fp32 (each chunk's product rounded once to the compute
// dtype), so bf16 results differ from the single-GEMM path by bf16 round-off only.
// MultimodalLM::forward keeps returning full logits (generate, tests, bench_logits); training, evaluation and
// `gmod forward`/`gmod eval` call forward_label_loss.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>

#include "model/llava.h"

namespace gmod {

// Rows per chunk when none is given: a chunk's fp32 logits take at most ~256 MiB (2048 rows at V = 32000).
int64_t lm_loss_chunk_rows(int64_t vocab_size);

// hidden [B, L, D] (after the final norm), head_weight [V, D], labels [B, L] int64 with -100 = ignored.
// Position t predicts labels[:, t + 1]. Returns (sum of the fp32 cross-entropy over labelled positions, their
// count). chunk_rows <= 0: lm_loss_chunk_rows(V). Differentiable w.r.t. hidden and head_weight.
std::pair<at::Tensor, int64_t> label_only_lm_loss_sum(const at::Tensor& hidden, const at::Tensor& head_weight,
                                                      const at::Tensor& labels, int64_t chunk_rows = 0);

// MultimodalLM::forward without the logits: the decoder runs as there, then label_only_lm_loss_sum on its
// output. in.labels must be defined. ModelOutput::logits stays undefined.
ModelOutput forward_label_loss(MultimodalLM& model, const ModelInputs& in, ForwardState& st,
                               int64_t chunk_rows = 0);

}  // namespace gmod

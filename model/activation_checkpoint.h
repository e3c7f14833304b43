// Activation checkpointing per decoder layer: a checkpointed block runs its forward without recording a
// graph, keeps only its input, and recomputes its activations during the backward. Works for any DecoderBlock
// (dense, MoD, A-MoD scoring layers) and with the data-parallel overlapped gradient reduction:
//  - The block is one autograd node whose inputs are the block input and every trainable parameter the block
//    uses (its own plus DecoderBlock::external_parameters(), e.g. γ-MoD's shared router). Its backward
//    recomputes the block on a detached copy of the input with gradients on and takes torch::autograd::grad()
//    w.r.t. the input and those parameters, which returns the gradients without accumulating them; the node
//    hands them to the engine, so each parameter still gets exactly one AccumulateGrad (and one
//    post-accumulate-grad hook) per backward.
//  - The recompute writes into a scratch ForwardState, so the caller's aux_losses and tokens get the block's
//    entries once. The block's auxiliary losses (MoD routing loss) are outputs of the node, so their
//    gradients reach the router through the recompute.
//  - Routing is replayed: the first pass records the block's token selection (RoutingPass::kRecord) and the
//    recompute processes exactly those tokens (kReplay), whatever the recomputed scores are. A-MoD's routing
//    scores (only ever used to select tokens) pass to the next layer detached; the scores a layer read are
//    saved for its recompute.
// In fp32 on CPU the gradients are bitwise those of the plain forward
// (tests/mod/test_activation_checkpoint.cpp). Forwards without gradient recording, with KV caches
// (generation) or with attention maps (ARank) never checkpoint.
#pragma once

#include <memory>
#include <string>

#include "model/decoder_layer.h"

namespace gmod {

// Which decoder layers are checkpointed: none, all ("full"), or those whose index % k == 0 ("every_k": layers
// 0, k, 2k, ...; every_1 = full).
struct ActivationCheckpointing {
  int every = 0;  // 0: none; k >= 1: layers with index % k == 0
  bool enabled() const { return every > 0; }
  bool applies(int layer) const { return every > 0 && layer % every == 0; }
  std::string to_string() const;  // "none", "full" or "every_<k>"
};
// "none" | "full" | "every_<k>" with k >= 1; throws std::invalid_argument naming the value otherwise.
ActivationCheckpointing parse_activation_checkpointing(const std::string& s);

// Whether a forward with this state may checkpoint: gradients are recorded, no KV caches, no attention maps.
bool can_checkpoint(const ForwardState& st);

// block->forward(h, st, layer_idx) with recomputation in the backward (see the top of this file). Falls back
// to the plain forward when !can_checkpoint(st) or when neither h nor any parameter of the block requires
// grad.
at::Tensor checkpointed_forward(const std::shared_ptr<DecoderBlock>& block, const at::Tensor& h,
                                ForwardState& st, int layer_idx);

}  // namespace gmod

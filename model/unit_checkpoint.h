// Activation checkpointing of one vision-tower unit (a CLIP encoder layer, a ConvNeXt stage): the unit runs
// without recording a graph, keeps only its input, and is recomputed in the backward, where
// torch::autograd::grad() w.r.t. the input and the unit's trainable parameters gives the gradients without
// accumulating them (the engine accumulates what the node returns, once per parameter, as for the decoder
// layers in model/activation_checkpoint.h). In fp32 on CPU the gradients are bitwise those of the plain
// forward.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

namespace gmod {

// fn(x) with recomputation in the backward. `params`: every tensor fn reads besides x that may need a
// gradient (those without requires_grad are skipped). Falls back to fn(x) when gradients are not recorded or
// neither x nor any parameter requires grad. `what` names the unit in error messages.
at::Tensor checkpointed_unit(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& x,
                             const std::vector<at::Tensor>& params, const std::string& what);

}  // namespace gmod

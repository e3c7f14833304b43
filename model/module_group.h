// A named level in a module's parameter path ("encoder", "layers", "mlp"): a torch::nn::Module that only
// holds the submodules registered under it, so the names match a Hugging Face checkpoint's keys.
#pragma once

#include <torch/nn/module.h>

namespace gmod {

class ModuleGroup : public torch::nn::Module {};

}  // namespace gmod

// Reads tensors from a file written by Python's `torch.save` (e.g. LLaVA's stage-1 `mm_projector.bin`) with
// LibTorch's own unpickler (torch::pickle_load), so no Python is needed. Supports the zip format that torch.save
// writes by default since PyTorch 1.6, holding a dict (or OrderedDict) of name -> tensor, possibly nested in dicts
// whose keys are then joined with '.'.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

namespace gmod {

// (name, tensor) in file order; tensors are contiguous CPU tensors owning their memory. Throws naming `path` when
// the file is missing, not a torch.save zip archive, or holds something other than a dict of tensors.
std::vector<std::pair<std::string, at::Tensor>> read_torch_save(const std::string& path);

}  // namespace gmod

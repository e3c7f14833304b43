// Reads tensors from a file written by Python's `torch.save` (LLaVA's stage-1 `mm_projector.bin`, transformers'
// `pytorch_model*.bin`) with LibTorch's own unpickler (torch::pickle_load), so no Python is needed and nothing is
// executed. Supports the zip format that torch.save writes by default since PyTorch 1.6, holding a dict of
// name -> tensor, possibly nested in dicts whose keys are then joined with '.'. Before anything is unpickled, every
// opcode of the archive's data.pkl is walked and the only globals allowed are those torch.save writes for tensors
// (torch._utils._rebuild_tensor_v2, the torch.*Storage types, collections.OrderedDict); any other global (a pickled
// Python object such as the Trainer's training_args.bin) is an error naming the file and the global.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

namespace gmod {

// (name, tensor) in file order; tensors are contiguous CPU tensors owning their memory. Throws naming `path` when
// the file is missing, not a torch.save zip archive, references another global, or holds something other than a dict
// of tensors (the entry and its kind are named).
std::vector<std::pair<std::string, at::Tensor>> read_torch_save(const std::string& path);

}  // namespace gmod

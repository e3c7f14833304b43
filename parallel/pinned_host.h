#pragma once
// Page-locked host buffers allocated at their exact size. LibTorch's caching host allocator (what
// at::empty(..., pinned_memory(true)) uses) rounds every block up to a power of two and keeps it cached, so a
// 6.5 GB offloaded state tensor holds 8 GiB of pinned memory; the offloaded optimizer's master and moments
// and its copy buffers come from here instead (cudaHostAlloc, freed by the tensor's deleter), so what gmod
// plan and ShardedAdamW::host_bytes() count is what is pinned.
#include <ATen/ATen.h>

namespace gmod {

// An uninitialised CPU tensor of `numel` elements of `dtype`, page-locked when `pinned` and CUDA is available
// (built with CUDA and a device present), else ordinary host memory. Throws a named error, with `what` and
// the size, when the pinned allocation fails.
at::Tensor host_empty(int64_t numel, at::ScalarType dtype, bool pinned, const char* what);

}  // namespace gmod

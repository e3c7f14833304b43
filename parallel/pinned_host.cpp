#include "parallel/pinned_host.h"

#include <stdexcept>
#include <string>

#ifdef GMOD_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace gmod {

at::Tensor host_empty(int64_t numel, at::ScalarType dtype, bool pinned, const char* what) {
  const auto opts = at::TensorOptions().dtype(dtype);
#ifdef GMOD_WITH_CUDA
  if (pinned && numel > 0) {
    const size_t bytes = size_t(numel) * c10::elementSize(dtype);
    void* p = nullptr;
    const cudaError_t rc = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    if (rc != cudaSuccess)
      throw std::runtime_error(std::string("parallel/pinned_host: cannot pin ") + std::to_string(bytes) +
                               " bytes of host memory for " + what + ": " + cudaGetErrorString(rc));
    return at::from_blob(
        p, {numel}, [](void* q) { cudaFreeHost(q); }, opts);
  }
#endif
  (void)what;
  return at::empty({numel}, opts.pinned_memory(pinned && numel > 0 && at::hasCUDA()));
}

}  // namespace gmod

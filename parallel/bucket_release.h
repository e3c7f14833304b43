// When a ZeRO-2 gradient bucket's storage may be dropped: the one rule DataParallelOptimizer
// (parallel/data_parallel.cpp launch/retire_front) follows and the memory plan (trainer/plan/memory_plan.cpp)
// counts. On CUDA every collective is enqueued on a stream (NCCL, or LocalComm's copies) and the caching
// allocator keeps a freed block from being reused until the streams recorded on it (recordStream in launch())
// have passed that point, so the bucket can be released as soon as its reduce-scatter is enqueued: the whole
// gradient never lives through the backward. With MPI (CPU) a non-blocking collective reads its buffer until
// wait(), so the bucket is released when its reduction is retired in step().
#pragma once

#include <c10/core/Device.h>

namespace gmod {

inline bool release_bucket_at_launch(int zero_stage, const c10::Device& comm_device) {
  return zero_stage == 2 && comm_device.is_cuda();
}

}  // namespace gmod

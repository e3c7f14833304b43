// Zero3Grads: the gradient half of ZeRO-3, a building block next to Zero3Params (not yet selectable from the
// trainer config). Each unit's gradient lives in its own buffer only while that unit's backward runs:
// attach(u) allocates it zeroed and points the unit's parameters' .grad into it (before the unit's backward,
// so autograd accumulates in place), reduce(u) reduce-scatters it (average over ranks, in reduce_dtype) into
// this rank's fp32 gradient shard — the same [r*S, (r+1)*S) range and the same per-element reduction as
// ZeRO-2's buckets — and frees it. So a rank holds its fp32 gradient shard plus the gradients of the units
// whose backward is running.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "parallel/zero3_params.h"

namespace gmod {

class Zero3Grads {
 public:
  Zero3Grads(Zero3Params& params, at::ScalarType reduce_dtype = at::kFloat);

  // Local: unit u's gradient buffer, zeroed, with its parameters' .grad views into it (no-op when attached).
  void attach(int u);
  // Collective (every rank, same order): averages unit u's gradient over ranks into shard_grad() (added to
  // what is there: accumulation windows reduce once, after their last backward) and frees the buffer.
  void reduce(int u);
  bool attached(int u) const { return bool(grad_.at(size_t(u)).defined()); }
  // [S] fp32: this rank's averaged gradient of layout().shard_range(rank).
  const at::Tensor& shard_grad() const { return gshard_; }
  void zero_shard_grad() { gshard_.zero_(); }
  // Bytes of gradient storage alive: the fp32 shard plus the attached units' buffers.
  int64_t bytes_held() const;

 private:
  Zero3Params& params_;
  at::ScalarType reduce_dtype_;
  std::vector<at::Tensor> grad_;  // per unit [end - begin], undefined when not attached
  std::vector<std::vector<size_t>> members_;
  at::Tensor gshard_;  // [S] fp32
};

}  // namespace gmod

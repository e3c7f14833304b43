// Zero3Params: the parameter half of ZeRO-3 (driven by parallel/zero3_driver.h for `optimizer.zero_stage: 3`).
// Trainable parameters are grouped in units (consecutive parameters: a decoder layer, a vision block, the
// embeddings, the head) and sharded over the ZeRO-1/2 flat layout (FlatParamLayout): rank r keeps only
// [r*S, (r+1)*S) of the padded flat vector in the params' dtype, exactly the range whose fp32 master and
// moments ZeRO-1/2 give it, so optimizer state and checkpoints are those of stage 1/2 and reshard between
// stages as they do. gather(u) re-creates unit u's full parameters (collective: each owner broadcasts its
// part of the unit); release(u) frees them. How freeing works under autograd: each unit's parameters are
// views into one buffer, and release() drops that buffer's *storage* (data pointer and size), not the
// tensors, as FSDP does. Parameters keep their identity (hooks, .grad, optimizer references), and the tensors
// autograd saved for backward (the weight, or views of it such as weight.t()) share that storage, so they
// hold no memory while the unit is released and see the values again once gather(u) re-allocates and refills
// it; a backward that reaches a released unit must gather it first (the caller's pre-backward hook), or it
// reads an unallocated tensor and fails loudly. No model knowledge: (name, tensor) pairs and a unit index per
// parameter.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallel/comm.h"
#include "parallel/flat_params.h"

namespace gmod {

class Zero3Params {
 public:
  using NamedParams = std::vector<std::pair<std::string, at::Tensor>>;

  // params: leaf tensors of one floating dtype on comm->device(), identical on every rank; unit[i] is
  // parameter i's unit, non-decreasing from 0 without gaps (each unit a run of consecutive parameters). The
  // parameters' storage moves into per-unit buffers; every unit starts gathered (call release to drop them).
  Zero3Params(NamedParams params, const std::vector<int>& unit, std::shared_ptr<Comm> comm);

  int num_units() const { return static_cast<int>(unit_range_.size()); }
  // [begin, end) of unit u in the flat vector (its first parameter's offset to its last one's end).
  std::pair<int64_t, int64_t> unit_range(int u) const { return unit_range_.at(size_t(u)); }
  // Gathered or being gathered (its buffer allocated).
  bool gathered(int u) const { return gathered_.at(size_t(u)); }
  bool in_flight(int u) const { return bool(pending_.at(size_t(u))); }
  // Collective (every rank, same order): allocates unit u's buffer and fills it from the owners' shards.
  // No-op when already gathered; completes a gather started earlier.
  void gather(int u);
  // Collective, non-blocking: allocates unit u's buffer, copies our part in and starts the all-gather of the
  // others' (Comm::all_gather_v_start). The unit's values are there after wait(u). No-op when gathered.
  void gather_start(int u);
  // Completes unit u's started gather (no-op when none is in flight).
  void wait(int u);
  // Drives the gathers in flight (MPI progresses only inside MPI calls); never blocks.
  void progress();
  // Local: frees unit u's buffer (its parameters keep their shapes, hold no memory); a gather in flight is
  // completed first. No-op when released.
  void release(int u);
  // This rank's part of the flat vector, [S] in the params' dtype (padding zero). Writing it changes what the
  // next gather() returns (gathered units keep their values until released).
  at::Tensor& shard() { return shard_; }
  // Copies the gathered unit u's values back into this rank's shard (after the caller changed the full
  // values, e.g. a broadcast from rank 0 at start-up).
  void store(int u);
  // Bytes of parameter storage alive on this rank: the shard plus the gathered units' buffers.
  int64_t bytes_held() const;

  const FlatParamLayout& layout() const { return layout_; }
  const NamedParams& params() const { return params_; }
  Comm& comm() const { return *comm_; }

 private:
  NamedParams params_;
  std::shared_ptr<Comm> comm_;
  FlatParamLayout layout_;
  at::Tensor shard_;              // [S]
  std::vector<at::Tensor> full_;  // per unit [end - begin]; storage freed when released
  std::vector<std::pair<int64_t, int64_t>> unit_range_;  // flat [begin, end) per unit
  std::vector<bool> gathered_;
  std::vector<std::unique_ptr<CommRequest>> pending_;  // per unit: its gather in flight
};

}  // namespace gmod

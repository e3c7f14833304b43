// ShardedAdamW: torch.optim.AdamW (decoupled weight decay, bias correction) on one contiguous range of the flat
// parameter vector, holding fp32 master weights and both moments for that range only (ZeRO-1/2 optimizer state; the
// whole unpadded vector for stage 0). Weight decay applies only inside the decay ranges (default: the whole range),
// i.e. torch.optim.AdamW with two parameter groups (weight_decay = wd and 0) and otherwise identical settings;
// set_groups() adds groups of ranges with their own learning rate and weight decay (optimizer.groups).
// AdamWShardState is its checkpointable form (this rank's range + the layout), and reshard_state rebuilds exactly the
// state any rank would own at another world size or stage.
// Offload (AdamWHyper::offload, optimizer.offload: "cpu"): master and moments live in host memory (pinned when the
// initial master is on a CUDA device), the update runs on CPU threads (parallel/adamw_cpu.h, bitwise the ATen
// sequence), a device gradient is copied to a host buffer first, and copy_master_to() writes the result back into
// device parameters (converted to their dtype on the host: bf16 halves the transfer). The state and checkpoint
// format do not change, so offloaded and device-resident runs load each other's checkpoints.
#pragma once

#include "parallel/flat_params.h"

#include <ATen/ATen.h>
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <utility>
#include <vector>

namespace gmod {

struct AdamWHyper {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  // Not a hyperparameter but carried with them so that every owner of a ShardedAdamW (ZeRO-0/1/2, ZeRO-3) gets it:
  // state in host memory and the update on CPU threads (see the top of this file).
  bool offload = false;
};

// One rank's optimizer state. Tensors are fp32 [end - begin]; [begin, end) is in padded flat coordinates of
// `layout` (stage 1/2: layout.shard_range(rank); stage 0: [0, P) on every rank).
struct AdamWShardState {
  FlatParamLayout layout;
  int stage = 0;
  int rank = 0;
  int64_t begin = 0, end = 0;
  int64_t step = 0;
  at::Tensor master, exp_avg, exp_avg_sq;

  // Everything except the tensors (layout, stage, rank, range, step) for a checkpoint's metadata.
  nlohmann::json meta() const;
  // Inverse of meta(); tensors are left undefined for the caller to fill.
  static AdamWShardState from_meta(const nlohmann::json& j);
};

class ShardedAdamW {
 public:
  // master0: initial fp32 master weights for [begin, end) ([end - begin] elements; copied).
  ShardedAdamW(int64_t begin, int64_t end, const at::Tensor& master0, AdamWHyper hyper);

  // One AdamW update of the range with its fp32 gradient [end - begin]; increments the step count. One group only
  // (see set_groups; throws otherwise).
  void step(const at::Tensor& grad, double lr) { step(grad, std::vector<double>{lr}); }

  // Elements that get weight decay: sorted, disjoint [b, e) in flat coordinates (clipped to [begin, end); the rest
  // of the range is updated without decay). Default: the whole range. Not part of the checkpointed state.
  void set_decay_ranges(std::vector<std::pair<int64_t, int64_t>> ranges);
  const std::vector<std::pair<int64_t, int64_t>>& decay_ranges() const { return decay_; }

  // Parameter groups, as torch.optim.AdamW's param_groups over flat ranges: group g's elements step with lrs[g]
  // (step(grad, lrs)) and, inside the decay ranges, weight decay weight_decay[g] (group 0 = the elements of no
  // range; its decay replaces hyper.weight_decay). ranges: sorted, disjoint [b, e) in flat coordinates with their
  // group (1 <= g < weight_decay.size(); clipped to [begin, end)). Default: one group. Not part of the
  // checkpointed state (the caller sets it from its config on resume).
  struct GroupRange {
    int64_t begin = 0, end = 0;
    int group = 0;
  };
  void set_groups(const std::vector<GroupRange>& ranges, std::vector<double> weight_decay);
  int num_groups() const { return int(group_wd_.size()); }
  // One AdamW update with a learning rate per group (lrs.size() == num_groups()).
  void step(const at::Tensor& grad, const std::vector<double>& lrs);

  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }
  int64_t step_count() const { return step_; }
  const at::Tensor& master() const { return master_; }
  const at::Tensor& exp_avg() const { return exp_avg_; }
  const at::Tensor& exp_avg_sq() const { return exp_avg_sq_; }
  const AdamWHyper& hyper() const { return hyper_; }
  // Bytes of master + exp_avg + exp_avg_sq actually allocated.
  int64_t state_bytes() const;
  bool offloaded() const { return hyper_.offload; }
  // Host bytes the offload holds: the state plus the host copy of a device gradient (0 without offload).
  int64_t host_bytes() const;
  // dst[i] = master[i] in dst's dtype and device (dst: [end - begin], e.g. the owned part of the compute
  // parameters). Offloaded to a CUDA device: converted on the host, then one host-to-device copy.
  void copy_master_to(at::Tensor dst) const;

  // Replaces the master weights (e.g. after parameters were broadcast); moments and step are kept.
  void reset_master(const at::Tensor& values);
  // Copies the tensors and step from s (which must cover exactly [begin, end)).
  void load(const AdamWShardState& s);

 private:
  int64_t begin_, end_;
  int64_t step_ = 0;
  AdamWHyper hyper_;
  at::Tensor master_, exp_avg_, exp_avg_sq_;
  std::vector<std::pair<int64_t, int64_t>> decay_;  // flat coordinates, inside [begin_, end_)
  std::vector<GroupRange> groups_;                  // non-zero groups, flat coordinates, inside [begin_, end_)
  std::vector<double> group_wd_;                    // per group; [0] = hyper_.weight_decay by default
  // [begin_, end_) cut where the group or the decay flag changes (built from decay_ and groups_).
  struct Segment {
    int64_t begin = 0, end = 0;
    int group = 0;
    bool decay = false;
  };
  std::vector<Segment> segments_;
  void build_segments();
  bool pinned_ = false;   // offloaded state in pinned memory (the initial master was on a CUDA device)
  at::Tensor grad_host_;  // offload with a device gradient: its host copy (pinned), allocated by the first step
  mutable at::Tensor out_host_;  // offload to CUDA with a non-fp32 destination: the converted master (pinned)
  void step_aten(const at::Tensor& grad, const std::vector<double>& lrs, double bias_correction1,
                 double bias_correction2_sqrt);
};

// The state that rank `new_rank` of a `new_world`-rank job at `new_stage` owns, rebuilt exactly from the states
// saved by every rank of one job (any order; for stage 0 a single state suffices). Values in [0, P) are copied
// bit-exactly; padding is zero.
AdamWShardState reshard_state(const std::vector<AdamWShardState>& saved, int new_world, int new_rank, int new_stage);
std::vector<AdamWShardState> reshard_states(const std::vector<AdamWShardState>& saved, int new_world, int new_stage);

}  // namespace gmod

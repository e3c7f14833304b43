// Zero3Driver: ZeRO-3 (`optimizer.zero_stage: 3`) driven from outside the model, the DpStrategy
// (parallel/dp_strategy.h) of stage 3. It shards the trainable parameters in units (parallel/zero3_params.h) and
// runs them through the model's unit hooks (model/unit_hooks.h; the units are the modules hooked_units() lists):
//  - Units. Each decoder layer, CLIP encoder layer, ConvNeXt stage, Qwen2.5-VL vision block and merger with
//    trainable parameters is a *hooked* unit: gathered just before its forward and released just after it (reshard after forward), gathered
//    again when its output's gradient arrives (a hook on the output; under activation checkpointing that is
//    before the recompute), released once every one of its parameters got its gradient. Every other trainable
//    parameter (embeddings, LM head, final norm, projector, vision stem, γ-MoD's shared router, adapters)
//    belongs to a *persistent* unit: a run of consecutive such parameters, gathered before each micro-batch's
//    forward and released after its backward. Parameters used by several units (tied embeddings and LM head,
//    the shared router read by every MoD layer) are therefore gathered from their first use to the end of the
//    backward, and their gradient, summed by autograd over every use into one .grad, is reduced once.
//  - Collective order. Gathers are collectives, so every rank gathers every hooked unit exactly once per
//  forward
//    and once per backward, in a fixed order (forward: vision units, then decoder layers; backward: the
//    reverse), whether or not it runs the unit: a rank whose micro-batch has no image gathers (and drops at
//    once) the vision units when its forward passes them, and a cursor catches up at the end of the forward
//    and backward. Gradient reductions (per unit, on the last micro-batch of a window) start non-blocking in
//    a fixed unit order (hooked units in backward order, then the persistent ones at the end of the
//    backward); a hooked unit's starts when the backward cursor has moved prefetch + 1 positions below it
//    (its backward is over on every rank that ran it), so the sequence of gathers and reductions is the same
//    on every rank whatever its data: on CUDA both run on one NCCL communicator (gathers on its gather
//    stream, reductions on Zero3Grads' reduction stream), on MPI the reductions use a second communicator. A
//    gradient that arrives for a unit whose reduction started throws, naming the parameter. On MPI what a
//    reduction holds is freed at fixed points only, never when a poll happens to find it complete: the one
//    the backward starts on reaching a unit is completed at that unit's first parameter gradient (the peers
//    started it before their own backward of the unit), so the bytes alive at any point of the backward do
//    not depend on the peers' timing (what docs/plan.md's plan-vs-measured check needs).
//  - Prefetch (`optimizer.zero3_prefetch` = d): before unit k runs, the gathers of the next d units of the
//  pass
//    (the forward's next layers, the backward's previous ones) are started, non-blocking
//    (Comm::all_gather_v_start), and unit k's own gather is waited for; so d + 1 units are held at once and
//    the next units' gathers overlap unit k's compute (MPI progresses them inside the hooks' MPI_Test calls).
//  - Reshard after forward (`optimizer.zero3_reshard_after_forward`, default true): false keeps each unit
//  that
//    ran with gradients gathered from its forward to its backward (FSDP's reshard_after_forward=False): no
//    backward gathers at all (also none for the units a rank skipped, so the ranks' collectives still pair
//    up), every such unit held at the end of the forward.
//  - Step: Zero3Optimizer (stage-2 arithmetic on the same shard, stage-2 state format), so parameters and
//    checkpoints are bitwise those of ZeRO-2 and move between stages and world sizes through reshard_state.
// Outside the training step (evaluation, saving, loading weights) gather_all() holds every unit until
// release_all(); the unit hooks do nothing meanwhile.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "model/unit_hooks.h"
#include "parallel/dp_strategy.h"
#include "parallel/zero3_grads.h"
#include "parallel/zero3_optimizer.h"
#include "parallel/zero3_params.h"

namespace gmod {

class Zero3GradHook;

class Zero3Driver final : public DpStrategy, public UnitHooks {
 public:
  using NamedParams = std::vector<std::pair<std::string, at::Tensor>>;
  using Units = std::vector<std::shared_ptr<torch::nn::Module>>;

  // units: the model's hooked units in forward order (hooked_units(model), model/unit_hooks.h); trainable: the
  // model's trainable parameters in named_parameters order (as ZeRO-1/2 get them; rank 0's values are broadcast).
  // Uses opts' AdamW hyper-parameters, max_grad_norm, reduce_dtype, offload, decay flags and groups. Installs
  // itself as the unit hooks until destroyed.
  Zero3Driver(Units units, NamedParams trainable, std::shared_ptr<Comm> comm, const DataParallelOptions& opts,
              int prefetch, bool reshard_after_forward = true);
  ~Zero3Driver() override;  // uninstalls the hooks
  Zero3Driver(const Zero3Driver&) = delete;
  Zero3Driver& operator=(const Zero3Driver&) = delete;

  // Around every micro-batch (collective: every rank calls them in the same order).
  void begin_forward() override;  // gathers the persistent units
  void end_forward() override;    // gathers and drops the hooked units this rank's forward did not reach
  void set_last_micro_batch(bool last = true) override { last_ = last; }  // before the window's last backward
  // The rest of the backward's gathers, releases; last micro-batch: every reduction done.
  void end_backward() override;
  // A micro-batch this rank has no data for (all its records were bad): the same collectives, nothing
  // computed.
  void idle_micro_batch(bool last) override;
  // comm's all_reduce after the window's reductions (a rank whose last micro-batch was idle reduces here).
  void all_reduce_after_gradients(at::Tensor& t, ReduceOp op = ReduceOp::Sum) override;
  StepResult step(double lr) { return step(std::vector<double>{lr}); }
  StepResult step(const std::vector<double>& lrs) override;  // one learning rate per parameter group (opts.group)
  void zero_grad() {}  // gradients live only between a unit's backward and its reduction

  // Collective: every unit gathered (values of the current shard) until release_all().
  void gather_all() override;
  void release_all() override;
  bool full_params_transient() const override { return true; }

  AdamWShardState state_dict() const override { return opt_->state_dict(); }
  void load_state_dict(const AdamWShardState& s) override { opt_->load_state_dict(s); }
  int state_stage() const override { return 2; }
  const FlatParamLayout& layout() const override { return params_->layout(); }
  std::string describe() const override;
  int64_t host_state_bytes() const override { return opt_->host_bytes(); }
  CommStats side_comm_stats() const override { return reduction_stats(); }
  int num_units() const { return params_->num_units(); }
  int num_hooked_units() const { return static_cast<int>(order_.size()); }
  int prefetch() const { return prefetch_; }
  bool reshard_after_forward() const { return reshard_; }
  // Bytes of parameter (shard + gathered units) and gradient (fp32 shard + unit buffers) storage alive now.
  int64_t param_bytes_held() const { return params_->bytes_held(); }
  int64_t grad_bytes_held() const { return grads_->bytes_held(); }
  // Traffic of the gradient reductions (their own communicator; the gathers run on the trainer's).
  const CommStats& reduction_stats() const { return grads_->reduce_comm().stats(); }

  // UnitHooks
  void pre_forward(const torch::nn::Module& unit) override;
  at::Tensor post_forward(const torch::nn::Module& unit, const at::Tensor& out) override;

 private:
  friend class Zero3GradHook;
  void pre_backward(int u);          // the unit's output gradient arrived
  void on_grad_ready(size_t index);  // parameter `index` got its gradient of this backward
  // Moves the backward cursor down to position `lowest`: starts each position's gather (the running unit's
  // is waited for by the caller) and, on the window's last micro-batch, the reductions it makes safe.
  void backward_cursor_to(int lowest, int running);
  void start_reductions_from(int lowest_pos);  // hooked units at positions >= lowest_pos, in red_order_
  void finish_reductions();                    // the rest of red_order_, then waits for all
  int unit_of(const torch::nn::Module& m) const;
  void reset_pass();

  std::shared_ptr<Comm> comm_;
  std::unique_ptr<Zero3Params> params_;
  std::unique_ptr<Zero3Grads> grads_;
  std::unique_ptr<Zero3Optimizer> opt_;
  int prefetch_ = 1;
  bool reshard_ = true;  // optimizer.zero3_reshard_after_forward
  bool offload_ = false;  // optimizer.offload: cpu
  bool mpi_collect_ = true;  // MPI, world > 1: a hooked unit's first gradient completes the reductions in flight

  std::vector<std::pair<const torch::nn::Module*, int>> module_unit_;  // hooked module -> unit
  std::vector<int> order_;                                             // hooked units in forward order
  std::vector<int> pos_;         // per unit: position in order_, -1 for persistent units
  std::vector<int> persistent_;  // persistent units, ascending
  std::vector<int> red_order_;   // reduction order: order_ reversed, then persistent_ descending
  std::vector<int> unit_of_param_;
  std::vector<int> members_;  // parameters per unit

  std::mutex mu_;
  bool suspended_ = false;  // gather_all() .. release_all()
  bool last_ = false;
  bool reduced_ = true;               // this window's reductions done (nothing pending)
  int fcur_ = 0;                      // next position of order_ the forward gathers
  int bcur_ = -1;                     // next position of order_ the backward gathers (descending)
  std::vector<char> ran_;             // per unit: ran forward with gradients in this micro-batch
  std::vector<int> pending_;          // per unit: parameters still without gradient in this backward
  std::vector<char> reduce_started_;  // per unit: its reduction of this window has started
  size_t rnext_ = 0;                  // next entry of red_order_ to start
};

}  // namespace gmod

#include "parallel/dp_strategy.h"

#include <stdexcept>

#include "parallel/zero3_driver.h"

namespace gmod {

void DpStrategy::with_full_params(const std::function<void()>& fn) {
  gather_all();
  try {
    fn();
  } catch (...) {
    release_all();
    throw;
  }
  release_all();
}

std::pair<int64_t, int64_t> DpStrategy::state_range(int rank) const {
  if (state_stage() == 0) return {0, layout().total()};
  return layout().shard_range(rank);
}

std::vector<int> saved_state_ranks(const FlatParamLayout& saved, int saved_stage, int saved_world,
                                   std::pair<int64_t, int64_t> range) {
  if (saved_stage == 0) return {0};
  std::vector<int> ranks;
  for (int r = 0; r < saved_world; ++r) {
    auto [b, e] = saved.shard_range(r);
    if (b < range.second && e > range.first) ranks.push_back(r);
  }
  return ranks;
}

namespace {

std::string mib(int64_t b) { return std::to_string((b + (1 << 19)) >> 20) + " MiB"; }

// ZeRO-0/1/2: the parameters, gradients and optimizer state of DataParallelOptimizer; the model is not touched.
class FlatDataParallel final : public DpStrategy {
 public:
  FlatDataParallel(NamedParams trainable, std::shared_ptr<Comm> comm, const DataParallelOptions& o)
      : world_(comm->world_size()) {
    for (const auto& [name, p] : trainable) num_params_ += p.numel();
    if (!trainable.empty()) dtype_ = trainable.front().second.scalar_type();
    opt_ = std::make_unique<DataParallelOptimizer>(std::move(trainable), std::move(comm), o);
    opt_->broadcast_params(0);
  }

  void set_last_micro_batch(bool last) override { opt_->set_last_micro_batch(last); }
  void all_reduce_after_gradients(at::Tensor& t, ReduceOp op) override { opt_->all_reduce_after_gradients(t, op); }
  StepResult step(const std::vector<double>& lrs) override {
    const StepResult r = opt_->step(lrs);
    opt_->zero_grad();
    return r;
  }
  const FlatParamLayout& layout() const override { return opt_->layout(); }
  AdamWShardState state_dict() const override { return opt_->state_dict(); }
  void load_state_dict(const AdamWShardState& s) override { opt_->load_state_dict(s); }
  int state_stage() const override { return opt_->options().stage; }

  std::string describe() const override {
    const DataParallelOptions& o = opt_->options();
    const DpMemory during = DataParallelOptimizer::memory_plan(num_params_, world_, dtype_, o, false);
    const DpMemory at_step = DataParallelOptimizer::memory_plan(num_params_, world_, dtype_, o, true);
    return "optimizer: ZeRO-" + std::to_string(o.stage) + ", gradients + optimizer state per rank " +
           mib(during.total()) + " during backward, " + mib(at_step.total()) + " in step() (fp32 state " +
           mib(at_step.optimizer_state) + ", fp32 averaged gradient " + mib(at_step.reduced_grad) + ")" +
           (o.offload ? "; offloaded to host memory: fp32 master + moments " + mib(at_step.host_state) : "");
  }
  int64_t host_state_bytes() const override { return opt_->memory_held().host_state; }
  // With overlap_comm the buckets run on a duplicate of the trainer's communicator.
  CommStats side_comm_stats() const override {
    if (&opt_->grad_comm() == &opt_->comm()) return {};
    return opt_->grad_comm().stats();
  }

 private:
  std::unique_ptr<DataParallelOptimizer> opt_;
  int world_ = 1;
  int64_t num_params_ = 0;
  at::ScalarType dtype_ = at::kFloat;
};

}  // namespace

std::unique_ptr<DpStrategy> make_dp_strategy(const DpSettings& settings, DpStrategy::NamedParams trainable,
                                             std::shared_ptr<Comm> comm,
                                             std::vector<std::shared_ptr<torch::nn::Module>> units) {
  DataParallelOptions o = settings.options;
  switch (settings.zero_stage) {
    case 0:
    case 1:
    case 2:
      o.stage = settings.zero_stage;
      return std::make_unique<FlatDataParallel>(std::move(trainable), std::move(comm), o);
    case 3:
      o.stage = 2;  // the arithmetic and state format of stage 2 (parallel/zero3_optimizer.h)
      return std::make_unique<Zero3Driver>(std::move(units), std::move(trainable), std::move(comm), o,
                                           settings.zero3_prefetch, settings.zero3_reshard_after_forward);
  }
  throw std::invalid_argument("optimizer.zero_stage must be 0, 1, 2 or 3, got " + std::to_string(settings.zero_stage));
}

}  // namespace gmod

#include "trainer/step_stats.h"

namespace gmod {

StepStats::StepStats(size_t n_mod, const at::TensorOptions& loss_options)
    : lm_loss_sum(at::zeros({}, loss_options)),
      routing_loss_sum(at::zeros({}, loss_options)),
      processed(n_mod, 0),
      entered(n_mod, 0),
      routable(n_mod, 0) {}

namespace {

// Offsets in the packed vector.
struct Layout {
  int64_t n;
  int64_t lm() const { return 0; }
  int64_t routing() const { return 1; }
  int64_t tokens() const { return 2; }
  int64_t samples() const { return 3; }
  int64_t stop() const { return 4; }
  int64_t processed(size_t i) const { return 5 + int64_t(i); }
  int64_t entered(size_t i) const { return 5 + n + int64_t(i); }
  int64_t padded() const { return 5 + 2 * n; }
  int64_t flops() const { return 6 + 2 * n; }
  int64_t dense_flops() const { return 7 + 2 * n; }
  int64_t routable(size_t i) const { return 8 + 2 * n + int64_t(i); }
  int64_t size() const { return 8 + 3 * n; }
};

}  // namespace

StepTotals reduce_step_stats(const StepStats& mine, at::Device device,
                             const std::function<void(at::Tensor&)>& all_reduce) {
  const size_t n_mod = mine.processed.size();
  const Layout ix{int64_t(n_mod)};
  at::Tensor packed = at::zeros({ix.size()}, at::TensorOptions().dtype(at::kDouble));
  auto acc = packed.accessor<double, 1>();
  acc[ix.tokens()] = double(mine.tokens);
  acc[ix.samples()] = double(mine.samples);
  acc[ix.stop()] = mine.stop ? 1.0 : 0.0;
  for (size_t i = 0; i < n_mod; ++i) {
    acc[ix.processed(i)] = double(mine.processed[i]);
    acc[ix.entered(i)] = double(mine.entered[i]);
    acc[ix.routable(i)] = double(mine.routable[i]);
  }
  acc[ix.padded()] = double(mine.padded_tokens);
  acc[ix.flops()] = mine.flops.flops;
  acc[ix.dense_flops()] = mine.flops.dense_flops;
  // The loss sums stay on the device until the reduction (no host sync per micro-batch).
  packed = packed.to(device);
  packed[ix.lm()] = mine.lm_loss_sum;
  packed[ix.routing()] = mine.routing_loss_sum;
  all_reduce(packed);
  packed = packed.cpu();
  const auto r = packed.accessor<double, 1>();

  StepTotals t;
  t.lm_loss_sum = r[ix.lm()];
  t.routing_loss_sum = r[ix.routing()];
  t.tokens = r[ix.tokens()];
  t.samples = r[ix.samples()];
  t.stop = r[ix.stop()] > 0;
  t.padded_tokens = r[ix.padded()];
  t.flops.flops = r[ix.flops()];
  t.flops.dense_flops = r[ix.dense_flops()];
  for (size_t i = 0; i < n_mod; ++i) {
    t.processed.push_back(r[ix.processed(i)]);
    t.entered.push_back(r[ix.entered(i)]);
    t.routable.push_back(r[ix.routable(i)]);
  }
  return t;
}

void StepTotals::skip_ratios(const std::vector<int>& mod_layers, std::map<int, double>& of_entered,
                             std::map<int, double>& of_routable) const {
  for (size_t i = 0; i < mod_layers.size(); ++i) {
    const double skipped = entered[i] - processed[i];
    if (entered[i] > 0) of_entered[mod_layers[i]] = 1.0 - processed[i] / entered[i];
    if (routable[i] > 0) of_routable[mod_layers[i]] = skipped / routable[i];
  }
}

}  // namespace gmod

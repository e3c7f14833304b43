// Held-out evaluation of the Trainer: LM loss, exact-match accuracy of greedy answers and MoD skip ratio, summed
// over this rank's slice of the eval set and all-reduced.
#include <torch/torch.h>

#include "mod/answer_match.h"
#include "model/lm_loss.h"
#include "trainer/trainer.h"

namespace gmod {

using json = nlohmann::json;

json Trainer::evaluate() {
  if (!eval_set_) return json::object();
  model_->eval();
  LoaderConfig lc{cfg_.batch.micro_batch,
                  rank_,
                  world_,
                  SamplerConfig{cfg_.seed, int64_t(world_) * cfg_.batch.micro_batch, false, 0},
                  cfg_.data.workers,
                  cfg_.data.prefetch,
                  -1,
                  1.0,
                  200,
                  false,
                  device_.is_cuda()};
  DataLoader loader(*eval_set_, lc);
  int64_t batches = loader.micro_steps_per_epoch();
  if (cfg_.eval.max_batches > 0) batches = std::min<int64_t>(batches, cfg_.eval.max_batches);
  const size_t n_mod = mod_layers_.size();
  // [lm_sum, supervised, samples, exact hits, exact counted, processed..., entered..., routable...]
  at::Tensor packed = at::zeros({5 + 3 * int64_t(n_mod)}, at::TensorOptions().dtype(at::kDouble));
  auto acc = packed.accessor<double, 1>();
  // ZeRO-3: every unit held for the evaluation (ranks run different numbers of forwards and generation steps, so
  // per-unit gathers would not pair up across ranks).
  dp_->with_full_params([&] {
    torch::NoGradGuard no_grad;
    for (int64_t k = 0; k < batches; ++k) {
      Batch b = loader.next();
      if (b.empty()) continue;
      ModelInputs in = to_model_inputs(b, device_);
      if (in.pixel_values.defined()) in.pixel_values = in.pixel_values.to(dtype_);
      if (in.pixel_values_videos.defined()) in.pixel_values_videos = in.pixel_values_videos.to(dtype_);
      ForwardState st;
      ModelOutput out = forward_label_loss(*model_, in, st);
      acc[0] += out.lm_loss_sum.item<double>();
      acc[1] += double(out.supervised_tokens);
      acc[2] += double(b.size());
      for (const LayerTokens& lt : st.tokens)
        for (size_t i = 0; i < n_mod; ++i)
          if (lt.layer == mod_layers_[i])
            acc[5 + i] += double(lt.processed), acc[5 + n_mod + i] += double(lt.total),
                acc[5 + 2 * n_mod + i] += double(std::max<int64_t>(lt.routable, 0));
      if (cfg_.eval.exact_match) {
        const auto [hits, counted] = first_answer_exact_match(*model_, in);
        acc[3] += double(hits);
        acc[4] += double(counted);
      }
    }
  });
  model_->train();
  packed = packed.to(device_);
  comm_->all_reduce(packed, ReduceOp::Sum);
  packed = packed.cpu();
  auto r = packed.accessor<double, 1>();
  json out{{"loss", r[0] / std::max(1.0, r[1])}, {"supervised_tokens", int64_t(r[1])}, {"samples", int64_t(r[2])}};
  if (cfg_.eval.exact_match) out["exact_match"] = r[3] / std::max(1.0, r[4]), out["exact_match_samples"] = int64_t(r[4]);
  if (n_mod > 0) {
    json sr = json::object(), srr = json::object();
    for (size_t i = 0; i < n_mod; ++i) {
      const double skipped = r[5 + n_mod + i] - r[5 + i];
      if (r[5 + n_mod + i] > 0) sr[std::to_string(mod_layers_[i])] = 1.0 - r[5 + i] / r[5 + n_mod + i];
      if (r[5 + 2 * n_mod + i] > 0) srr[std::to_string(mod_layers_[i])] = skipped / r[5 + 2 * n_mod + i];
    }
    out["skip_ratio"] = sr;  // of all tokens (α)
    out["skip_ratio_routable"] = srr;
  }
  return out;
}

}  // namespace gmod

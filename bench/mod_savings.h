// bench_mod's realised-vs-theoretical saving (kept apart from the timing code of bench_mod.cpp): the training
// step's FLOP saving on the trainer's formula (trainer/flops.h: forward + backward, LM head included) next to its
// wall-clock saving, and batched decode with γ-MoD's thresholds, where skipped samples leave a layer's matmuls
// (mod/mod_decode.cpp), against the same decode of the dense model.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <utility>

#include "mod/conversion.h"
#include "mod/generate.h"
#include "trainer/flops.h"

#ifdef GMOD_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace gmod::bench {

inline double seconds_of(bool cuda, const std::function<void()>& f) {
  if (cuda) torch::cuda::synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  f();
  if (cuda) torch::cuda::synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline void print_saving(const char* what, double t_dense, double t_mod, double flops, double dense_flops) {
  const double real = 1.0 - t_mod / t_dense, theo = 1.0 - flops / dense_flops;
  std::printf("%-22s dense %8.1f ms  mod %8.1f ms  wall-clock saving %5.1f%%  FLOP saving %5.1f%%  realised %.2f\n",
              what, 1e3 * t_dense, 1e3 * t_mod, 100 * real, 100 * theo, theo > 0 ? real / theo : 0.0);
}

// The fwd+bwd step of `model` (MoD) on `in`: train FLOPs against the dense model on the same tokens, everything
// trainable, against the measured step times.
// Returns {the MoD model's train-step FLOPs, the dense model's}.
inline std::pair<double, double> print_train_flop_saving(MultimodalLM& model, const ModelInputs& in, double t_dense,
                                                         double t_mod) {
  ForwardState st;
  {
    at::NoGradGuard ng;
    model.forward(in, st);
  }
  const auto shape = ForwardShape::full(sample_lengths(in.attention_mask, in.input_ids.size(0), in.input_ids.size(1)));
  const auto parts = TrainableParts::of(model, model.config.text.num_hidden_layers, model.config.text.tie_word_embeddings);
  auto all = parts;
  all.embedding = all.head = true;
  for (size_t i = 0; i < all.layers.size(); ++i) all.layers[i] = true;
  const auto f = train_flops(account_forward(st.tokens, model.config, shape), all);
  std::printf("train step FLOPs (trainer/flops.h, LM head included): %.4g GFLOP, dense %.4g GFLOP\n", f.flops * 1e-9,
              f.dense_flops * 1e-9);
  print_saving("fwd+bwd (train FLOPs)", t_dense, t_mod, f.flops, f.dense_flops);
  return {double(f.flops), double(f.dense_flops)};
}

// CUDA peak memory statistics of this process (MiB): reset before a variant, read after its steps; no-ops on the
// CPU or without CUDA.
inline void reset_cuda_peaks(bool cuda) {
#ifdef GMOD_WITH_CUDA
  if (cuda) c10::cuda::CUDACachingAllocator::resetPeakStats(c10::cuda::current_device());
#endif
  (void)cuda;
}
inline void cuda_peaks(bool cuda, double& alloc_mib, double& reserved_mib) {
#ifdef GMOD_WITH_CUDA
  if (cuda) {
    const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::cuda::current_device());
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    alloc_mib = double(s.allocated_bytes[agg].peak) / (1 << 20);
    reserved_mib = double(s.reserved_bytes[agg].peak) / (1 << 20);
  }
#endif
  (void)cuda, (void)alloc_mib, (void)reserved_mib;
}

// Batched greedy decode of `new_tokens` tokens after the prompts `in` (no EOS stop), dense against γ-MoD with
// `cfg` in eval mode (thresholds: prefill p > infer_threshold, decode p >= decode_threshold). Prefill and decode
// times are GenerateResult's (prefill_seconds, decode_seconds), each the fastest of 3 runs; the decode FLOPs are
// the whole generation's minus its prefill's (a 1-token generation). bench_decode has the fuller table.
inline void bench_decode(const std::function<std::shared_ptr<MultimodalLM>()>& make, MoDConfig cfg, ModelInputs in,
                         int new_tokens, bool cuda) {
  in.labels = at::Tensor();
  cfg.mode = RoutingMode::kAuto;  // eval mode: γ-MoD's thresholds
  GenerateOptions o;
  o.eos_token_id = -1;
  double t[2][2] = {};
  ComputeReport rep[2][2];
  for (int variant : {1, 0}) {  // MoD first: the dense run does not pay the process's warm-up
    auto model = make();
    if (variant == 1) {
      convert_to_mod(*model, cfg);
      // A random router gives p close to 0.5; spread it so that decode decisions differ between samples.
      at::NoGradGuard ng;
      shared_router(*model)->weight.mul_(20.0);
    }
    model->eval();
    o.max_new_tokens = 1;
    rep[variant][0] = generate(*model, in, o).compute;
    o.max_new_tokens = new_tokens;
    generate(*model, in, o);  // warm-up
    // The fastest of 3: on a shared machine other processes only ever add time.
    t[variant][0] = t[variant][1] = 1e30;
    for (int i = 0; i < 3; ++i) {
      auto r = generate(*model, in, o);
      t[variant][0] = std::min(t[variant][0], r.prefill_seconds);
      t[variant][1] = std::min(t[variant][1], r.decode_seconds);
      rep[variant][1] = r.compute;
    }
  }
  (void)cuda;  // generate() synchronises the device at its timing boundaries
  const auto& m = rep[1][1];
  std::printf("batched decode (%d tokens x %lld samples): MoD layers skipped %.1f%% of token evaluations "
              "(prefill + decode)\n",
              new_tokens, static_cast<long long>(in.input_ids.size(0)), 100 * m.mod_skip_ratio());
  print_saving("prefill (thresholds)", t[0][0], t[1][0], rep[1][0].flops, rep[1][0].dense_flops);
  print_saving("decode steps", t[0][1], t[1][1], m.flops - rep[1][0].flops, m.dense_flops - rep[1][0].dense_flops);
}

}  // namespace gmod::bench

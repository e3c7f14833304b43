// Activation checkpointing: activation memory saved and step-time cost of none / full / every_2 on a dense
// model and on a γ-MoD model (MoD on every layer but the first and last, skip_frac 0.5 of the routable
// tokens). Memory comes from trainer/plan/memory_tracker.h, a counting wrapper around the CPU allocator (every
// CPU tensor allocation, not RSS): "kept" is what is still allocated after the forward (the activations held
// for the backward), "peak" the highest allocation during forward+backward, both above the resident
// parameters and gradients. Time is the fastest fwd+bwd step (modes interleaved).
//   bench_checkpointing [--hidden 512] [--layers 8] [--seq 512] [--batch 2] [--iters 3]
#include <ATen/ATen.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_help.h"
#include "mod/conversion.h"
#include "model/activation_checkpoint.h"
#include "model/token_roles.h"
#include "trainer/plan/memory_tracker.h"

using namespace gmod;

namespace {

struct Args {
  int hidden = 512, layers = 8, seq = 512, batch = 2, iters = 3;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    auto next = [&](int& v) {
      if (i + 1 >= argc) throw std::invalid_argument(std::string("missing value for ") + argv[i]);
      v = std::stoi(argv[++i]);
    };
    if (!std::strcmp(argv[i], "--hidden"))
      next(a.hidden);
    else if (!std::strcmp(argv[i], "--layers"))
      next(a.layers);
    else if (!std::strcmp(argv[i], "--seq"))
      next(a.seq);
    else if (!std::strcmp(argv[i], "--batch"))
      next(a.batch);
    else if (!std::strcmp(argv[i], "--iters"))
      next(a.iters);
    else
      throw std::invalid_argument(std::string("unknown option ") + argv[i]);
  }
  if (a.seq < 128 || a.hidden % 64 != 0 || a.layers < 3 || a.iters < 1)
    throw std::invalid_argument("need --seq >= 128, --hidden a multiple of 64, --layers >= 3, --iters >= 1");
  return a;
}

std::shared_ptr<MultimodalLM> make_model(const Args& a, const MoDConfig* mod) {
  LlavaConfig c;
  c.text.hidden_size = a.hidden;
  c.text.num_hidden_layers = a.layers;
  c.text.num_attention_heads = a.hidden / 64;
  c.text.num_key_value_heads = a.hidden / 64;
  c.text.intermediate_size = a.hidden * 8 / 3;
  c.text.vocab_size = 1000;
  auto m = std::make_shared<MultimodalLM>(c);
  m->init_weights(1);
  if (mod) convert_to_mod(*m, *mod);
  m->train();
  return m;
}

// System prefix, a routable image-like span of 5/8 of the sequence, then question and answer tokens.
ModelInputs make_inputs(const Args& a) {
  ModelInputs in;
  in.input_ids = at::randint(3, 1000, {a.batch, a.seq}, at::kLong);
  in.labels = in.input_ids.clone();
  const int routable = a.seq * 5 / 8;
  in.token_roles = at::full({a.batch, a.seq}, static_cast<int64_t>(TokenRole::kAnswer), at::kChar);
  in.token_roles.narrow(1, 0, 32).fill_(static_cast<int64_t>(TokenRole::kSystem));
  in.token_roles.narrow(1, 32, routable - 32).fill_(static_cast<int64_t>(TokenRole::kImage));
  in.token_roles.narrow(1, routable, std::min(64, a.seq - routable))
      .fill_(static_cast<int64_t>(TokenRole::kQuestion));
  return in;
}

struct Result {
  double kept_mib = 0, peak_mib = 0, step_s = 1e30;
};

// One fwd+bwd step with `mode`; fills the memory figures and keeps the fastest time seen.
void step(MultimodalLM& m, const ModelInputs& in, const MoDConfig& cfg, const char* mode, Result& r) {
  m.llm->activation_checkpointing = parse_activation_checkpointing(mode);
  const auto t0 = std::chrono::steady_clock::now();
  MemoryTracker& mem = *MemoryTracker::get();
  const int64_t base = mem.live_bytes();
  mem.reset_peak();
  ForwardState st;
  ModelOutput out = m.forward(in, st);
  at::Tensor loss = out.lm_loss;
  if (!st.aux_losses.empty()) loss = loss + total_routing_loss(st, cfg);
  r.kept_mib = double(mem.live_bytes() - base) / (1 << 20);
  loss.backward();
  r.peak_mib = double(mem.peak_bytes() - base) / (1 << 20);
  r.step_s = std::min(r.step_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace

const char* const kUsage =
    "usage: bench_checkpointing [--hidden 512] [--layers 8] [--seq 512] [--batch 2] [--iters 3]\n"
    "Activation checkpointing (none / full / every_2) on a dense and a γ-MoD model: activation memory\n"
    "kept after the forward, peak during forward+backward, and the fastest step time.\n";

int main(int argc, char** argv) {
  if (gmod::bench_help(argc, argv, kUsage)) return 0;
  MemoryTracker::install();  // before any tensor exists

  Args a;
  try {
    a = parse(argc, argv);
  } catch (const std::exception& e) {  // a usage error: say so, no uncaught-exception abort
    std::fprintf(stderr, "bench_checkpointing: error: %s (--help lists the options)\n", e.what());
    return 2;
  }
  at::manual_seed(0);
  const ModelInputs in = make_inputs(a);
  MoDConfig cfg;
  for (int i = 1; i + 1 < a.layers; ++i) cfg.mod_layers.push_back(i);
  cfg.skip_frac = 0.5;

  std::printf("config: hidden %d, layers %d, seq %d, batch %d, fp32 cpu, %d threads, fastest of %d steps\n",
              a.hidden, a.layers, a.seq, a.batch, at::get_num_threads(), a.iters);
  std::printf("model   %-8s %12s %12s %10s %9s %9s\n", "ckpt", "kept MiB", "peak MiB", "step ms", "kept",
              "time");
  const char* modes[3] = {"none", "full", "every_2"};
  for (int variant = 0; variant < 2; ++variant) {
    auto m = make_model(a, variant == 1 ? &cfg : nullptr);
    Result r[3];
    for (int k = 0; k < 3; ++k) step(*m, in, cfg, modes[k], r[k]);  // warm-up: gradients exist from here on
    for (int k = 0; k < 3; ++k) r[k].step_s = 1e30;
    // Modes interleaved and the fastest step kept: other load on the machine hits every mode alike.
    for (int i = 0; i < a.iters; ++i)
      for (int k = 0; k < 3; ++k) step(*m, in, cfg, modes[k], r[k]);
    for (int k = 0; k < 3; ++k)
      std::printf("%s %-8s %12.1f %12.1f %10.1f %8.0f%% %8.0f%%\n", variant == 1 ? "γ-MoD  " : "dense  ",
                  modes[k], r[k].kept_mib, r[k].peak_mib, 1e3 * r[k].step_s,
                  100.0 * r[k].kept_mib / r[0].kept_mib, 100.0 * r[k].step_s / r[0].step_s);
    std::fflush(stdout);
  }
  return 0;
}

// Mixture-of-Depths speed: forward+backward step time and prefill time of a model with MoD on most
// layers (all but the first and last) at skip_frac 0.5 of the routable tokens, against the dense
// model, next to the theoretical FLOP ratio from the accounting, and the host synchronisations of one
// training step (mod/host_sync_counter.h: item / nonzero / device-to-host reads, and .cpu() calls that would
// wait on an accelerator) for dense, γ-MoD and A-MoD (paper defaults: every other layer). Equal sample lengths
// (every sample seq tokens) and unequal ones (seq, 7/8, 3/4, 5/8 ... of seq, right-padded: ragged kept counts).
// Random weights, text-only inputs with image-like routable spans; the host role counts are made as the data
// pipeline makes them (data/batch.cpp), so a step's syncs are the trainer's.
// With --bf16 / --checkpointing full (the GPU check's ≈1B-parameter shape): model FLOP utilisation against the
// device's peak (trainer/peak_flops.h), tokens/s and, on CUDA, peak allocated and reserved memory per variant.
//   bench_mod [--hidden 512] [--layers 8] [--seq 512] [--batch 4] [--iters 3] [--routable 5/8 seq]
//             [--lengths equal|unequal|both] [--cuda] [--bf16] [--checkpointing none|full] [--no-decode]
#include <ATen/ATen.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "bench/bench_help.h"
#include "bench/mod_savings.h"
#include "mod/accounting.h"
#include "mod/conversion.h"
#include "mod/host_sync_counter.h"
#include "model/activation_checkpoint.h"
#include "model/token_roles.h"
#include "trainer/metrics.h"

using namespace gmod;

namespace {

struct Args {
  int hidden = 512, layers = 8, seq = 512, batch = 4, iters = 3, routable = 0;  // 0: 5/8 of seq
  bool cuda = false, bf16 = false, decode = true;
  std::string lengths = "both", checkpointing = "none";
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    auto next = [&](int& v) {
      if (i + 1 >= argc) throw std::invalid_argument(std::string("missing value for ") + argv[i]);
      v = std::stoi(argv[++i]);
    };
    if (!std::strcmp(argv[i], "--hidden")) next(a.hidden);
    else if (!std::strcmp(argv[i], "--layers")) next(a.layers);
    else if (!std::strcmp(argv[i], "--seq")) next(a.seq);
    else if (!std::strcmp(argv[i], "--batch")) next(a.batch);
    else if (!std::strcmp(argv[i], "--iters")) next(a.iters);
    else if (!std::strcmp(argv[i], "--routable")) next(a.routable);
    else if (!std::strcmp(argv[i], "--cuda")) a.cuda = true;
    else if (!std::strcmp(argv[i], "--bf16")) a.bf16 = true;
    else if (!std::strcmp(argv[i], "--no-decode")) a.decode = false;
    else if (!std::strcmp(argv[i], "--checkpointing") && i + 1 < argc) a.checkpointing = argv[++i];
    else if (!std::strcmp(argv[i], "--lengths") && i + 1 < argc) a.lengths = argv[++i];
    else throw std::invalid_argument(std::string("unknown option ") + argv[i]);
  }
  if (a.routable == 0) a.routable = a.seq * 5 / 8;
  if (a.checkpointing != "none" && a.checkpointing != "full")
    throw std::invalid_argument("--checkpointing must be none or full");
  if (a.routable < 33 || a.routable > a.seq) throw std::invalid_argument("--routable must be in [33, seq]");
  if (a.lengths != "equal" && a.lengths != "unequal" && a.lengths != "both")
    throw std::invalid_argument("--lengths must be equal, unequal or both");
  return a;
}

std::shared_ptr<MultimodalLM> make_model(const Args& a, at::Device dev) {
  LlavaConfig c;
  c.text.hidden_size = a.hidden;
  c.text.num_hidden_layers = a.layers;
  c.text.num_attention_heads = a.hidden / 64;
  c.text.num_key_value_heads = a.hidden / 64;
  c.text.intermediate_size = a.hidden * 8 / 3;
  c.text.vocab_size = 1000;
  auto m = std::make_shared<MultimodalLM>(c);
  m->init_weights(1);
  m->to(dev, a.bf16 ? at::kBFloat16 : at::kFloat);
  m->llm->activation_checkpointing = parse_activation_checkpointing(a.checkpointing);
  return m;
}

// Sample b has length seq (equal) or seq * (8 - b % 4) / 8 (unequal), right-padded.
std::vector<int64_t> sample_lengths(const Args& a, bool unequal) {
  std::vector<int64_t> n;
  for (int b = 0; b < a.batch; ++b) n.push_back(unequal ? int64_t(a.seq) * (8 - b % 4) / 8 : a.seq);
  return n;
}

ModelInputs make_inputs(const Args& a, const std::vector<int64_t>& lengths, at::Device dev) {
  ModelInputs in;
  in.input_ids = at::randint(3, 1000, {a.batch, a.seq}, at::kLong);
  in.attention_mask = at::zeros({a.batch, a.seq}, at::kBool);
  in.token_roles = at::full({a.batch, a.seq}, static_cast<int64_t>(TokenRole::kPad), at::kChar);
  for (int b = 0; b < a.batch; ++b) {
    const int64_t n = lengths[b];
    auto r = in.token_roles[b];
    in.attention_mask[b].narrow(0, 0, n).fill_(true);
    r.narrow(0, 0, n).fill_(static_cast<int64_t>(TokenRole::kAnswer));
    r.narrow(0, 0, 32).fill_(static_cast<int64_t>(TokenRole::kSystem));
    const int64_t img_end = std::min<int64_t>(a.routable, n);
    r.narrow(0, 32, img_end - 32).fill_(static_cast<int64_t>(TokenRole::kImage));
    if (img_end < n) r.narrow(0, img_end, std::min<int64_t>(64, n - img_end)).fill_(static_cast<int64_t>(TokenRole::kQuestion));
  }
  in.labels = in.input_ids.masked_fill(in.attention_mask.logical_not(), -100);
  in.host_role_counts = count_routing_roles(in.token_roles, in.attention_mask, a.batch, a.seq);
  in.input_ids = in.input_ids.to(dev);
  in.labels = in.labels.to(dev);
  in.attention_mask = in.attention_mask.to(dev);
  in.token_roles = in.token_roles.to(dev);
  return in;
}

template <typename F>
double time_it(int iters, bool cuda, F f) {
  f();  // warm-up
  if (cuda) torch::cuda::synchronize();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) f();
  if (cuda) torch::cuda::synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
}

}  // namespace

const char* const kUsage =
    "usage: bench_mod [--hidden 512] [--layers 8] [--seq 512] [--batch 4] [--iters 3] [--routable N]\n"
    "                 [--lengths equal|unequal|both] [--cuda] [--bf16] [--checkpointing none|full] [--no-decode]\n"
    "Mixture-of-Depths vs dense: fwd+bwd step and prefill time next to the FLOP ratio of the accounting,\n"
    "and the host synchronisations of one training step, for dense, γ-MoD and A-MoD, equal and ragged\n"
    "sample lengths.\n";

int main(int argc, char** argv) {
  if (gmod::bench_help(argc, argv, kUsage)) return 0;
  Args a;
  try {
    a = parse(argc, argv);
  } catch (const std::exception& e) {  // a usage error: say so, no uncaught-exception abort
    std::fprintf(stderr, "bench_mod: error: %s (--help lists the options)\n", e.what());
    return 2;
  }
  const at::Device dev = a.cuda ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  MoDConfig gamma;
  for (int i = 1; i + 1 < a.layers; ++i) gamma.mod_layers.push_back(i);
  gamma.skip_frac = 0.5;
  gamma.mode = RoutingMode::kTopK;  // the same static capacity for training and prefill
  MoDConfig amod;                   // A-MoD as the paper defines it: interleaved, all tokens routable at C = 0.5
  amod.router = RouterKind::kAttention;
  for (int i = 1; i + 1 < a.layers; i += 2) amod.mod_layers.push_back(i);
  amod.skip_frac = 0.5;
  const char* variant_names[3] = {"dense", "gamma-MoD", "A-MoD"};
  const MoDConfig* variant_cfg[3] = {nullptr, &gamma, &amod};

  std::printf("config: hidden %d, layers %d (γ-MoD %zu, A-MoD %zu), seq %d, batch %d, routable %d, skip_frac 0.5, %s, "
              "%s, activation checkpointing %s\n",
              a.hidden, a.layers, gamma.mod_layers.size(), amod.mod_layers.size(), a.seq, a.batch, a.routable,
              a.cuda ? "cuda" : "cpu", a.bf16 ? "bf16" : "fp32", a.checkpointing.c_str());
  for (int unequal = 0; unequal < 2; ++unequal) {
    if ((unequal && a.lengths == "equal") || (!unequal && a.lengths == "unequal")) continue;
    const auto lengths = sample_lengths(a, unequal);
    auto in = make_inputs(a, lengths, dev);
    std::printf("\n== %s sample lengths:", unequal ? "unequal" : "equal");
    for (auto n : lengths) std::printf(" %lld", static_cast<long long>(n));
    std::printf("\n");
    double times[3][2];
    HostSyncCounter::Counts syncs[3];
    ComputeReport rep[3];
    double peak_alloc[3] = {}, peak_reserved[3] = {};
    for (int variant = 0; variant < 3; ++variant) {
      bench::reset_cuda_peaks(a.cuda);
      auto model = make_model(a, dev);
      if (variant_cfg[variant]) convert_to_mod(*model, *variant_cfg[variant]);
      model->train();
      auto step = [&] {
        model->zero_grad();
        ForwardState st;
        auto out = model->forward(in, st);
        auto loss = out.lm_loss;
        if (variant_cfg[variant]) {
          auto aux = total_routing_loss(st, *variant_cfg[variant]);
          if (aux.defined()) loss = loss + aux;
        }
        loss.backward();
      };
      times[variant][0] = time_it(a.iters, a.cuda, step);
      {
        HostSyncCounter counter;
        step();
        syncs[variant] = counter.counts();
      }
      bench::cuda_peaks(a.cuda, peak_alloc[variant], peak_reserved[variant]);
      times[variant][1] = time_it(a.iters, a.cuda, [&] {
        at::NoGradGuard ng;
        ForwardState st;
        model->forward(in, st);
        rep[variant] = account_compute(st.tokens, model->config.text, lengths);
      });
    }
    std::printf("%s", rep[1].table().c_str());
    const char* names[2] = {"fwd+bwd step", "prefill"};
    for (int variant = 1; variant < 3; ++variant) {
      const double theo = 1.0 - rep[variant].flop_ratio();  // decoder FLOPs only (no embeddings / LM head)
      for (int k = 0; k < 2; ++k) {
        const double real = 1.0 - times[variant][k] / times[0][k];
        std::printf("%-9s %-13s dense %8.1f ms  mod %8.1f ms  realised saving %5.1f%% / theoretical saving %5.1f%% = %.2f\n",
                    variant_names[variant], names[k], 1e3 * times[0][k], 1e3 * times[variant][k], 100 * real,
                    100 * theo, theo > 0 ? real / theo : 0.0);
      }
    }
    for (int variant = 0; variant < 3; ++variant)
      std::printf("host syncs per training step  %-9s %s\n", variant_names[variant], syncs[variant].to_string().c_str());
    {  // realised against theoretical on the trainer's FLOP formula, and batched decode (bench/mod_savings.h)
      auto model = make_model(a, dev);
      convert_to_mod(*model, gamma);
      const auto f = bench::print_train_flop_saving(*model, in, times[0][0], times[1][0]);
      const double peak = default_peak_tflops(dev, a.bf16 ? at::kBFloat16 : at::kFloat) * 1e12;
      int64_t tokens = 0;
      for (auto n : lengths) tokens += n;
      for (int variant = 0; variant < 2; ++variant) {
        const double fl = variant ? f.first : f.second, t = times[variant][0];
        char mfu[32] = "n/a";
        if (peak > 0) std::snprintf(mfu, sizeof mfu, "%.1f%%", 100 * fl / t / peak);
        std::printf("%-9s train step %8.1f ms  %10.0f tokens/s  %7.2f TFLOP/s  MFU %s", variant_names[variant],
                    1e3 * t, double(tokens) / t, fl / t * 1e-12, mfu);
        if (a.cuda) std::printf("  peak allocated %.0f MiB, reserved %.0f MiB", peak_alloc[variant], peak_reserved[variant]);
        std::printf("\n");
      }
      if (a.decode) bench::bench_decode([&] { return make_model(a, dev); }, gamma, in, 16, a.cuda);
    }
  }
  return 0;
}

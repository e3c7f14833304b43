// Generation speed, dense vs γ-MoD side by side in one run: prefill time and next-token time at batch 1 (as the
// official gamma_mod/eval/model_speed.py measures it: one prompt, greedy, 64 new tokens, repeated, new tokens per
// second of whole generate calls) and batched (8 and 16 samples), the FLOP saving of what was computed (the
// generation's ComputeReport against the same generation without MoD, LM head included) and the fraction of that
// saving realised in wall-clock time. Times come from GenerateResult (prefill_seconds, decode_seconds /
// decode_steps); each figure is the fastest of --reps runs after a warm-up (a shared machine only ever adds time).
// On the CPU the same figures also in process CPU time (std::clock: a 1-token generate for the prefill, the full
// one minus it per decode step), which a loaded machine disturbs far less than wall-clock (run it with
// OMP_NUM_THREADS=1 there).
// Two model shapes: the demo model's (configs/demo_model: hidden 64, 6 layers) and a larger LLaMA-shaped one
// (--hidden, --layers; 32000-token vocabulary). Random weights; the prompt is a system span, an image-like
// routable span and a question (the LLaVA layout); γ-MoD on every layer but the first and last, its shared router
// spread (x20) so that decisions differ between samples and steps, thresholds 0.5 at prefill and decode.
//   bench_decode [--new 64] [--reps 3] [--batches 1,8,16] [--hidden 1024] [--layers 12] [--seq 320]
//                [--demo-seq 320] [--only demo|llama] [--cuda]
#include <ATen/ATen.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_help.h"
#include "mod/conversion.h"
#include "mod/generate.h"
#include "model/token_roles.h"

using namespace gmod;

namespace {

struct Args {
  int new_tokens = 64, reps = 3, hidden = 1024, layers = 12, seq = 320, demo_seq = 320;
  std::vector<int> batches{1, 8, 16};
  std::string only;
  bool cuda = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(std::string("missing value for ") + argv[i]);
      return argv[++i];
    };
    const std::string o = argv[i];
    if (o == "--new") a.new_tokens = std::stoi(value());
    else if (o == "--reps") a.reps = std::stoi(value());
    else if (o == "--hidden") a.hidden = std::stoi(value());
    else if (o == "--layers") a.layers = std::stoi(value());
    else if (o == "--seq") a.seq = std::stoi(value());
    else if (o == "--demo-seq") a.demo_seq = std::stoi(value());
    else if (o == "--only") a.only = value();
    else if (o == "--cuda") a.cuda = true;
    else if (o == "--batches") {
      a.batches.clear();
      std::stringstream ss(value());
      for (std::string b; std::getline(ss, b, ',');) a.batches.push_back(std::stoi(b));
    } else throw std::invalid_argument("unknown option " + o);
  }
  if (a.new_tokens < 2 || a.reps < 1) throw std::invalid_argument("--new must be >= 2 and --reps >= 1");
  if (a.seq < 100 || a.demo_seq < 100) throw std::invalid_argument("--seq and --demo-seq must be >= 100");
  if (a.hidden % 64 || a.hidden < 64 || a.layers < 3) throw std::invalid_argument("--hidden: a multiple of 64; --layers >= 3");
  if (a.only != "" && a.only != "demo" && a.only != "llama") throw std::invalid_argument("--only must be demo or llama");
  for (int b : a.batches)
    if (b < 1) throw std::invalid_argument("--batches: every batch size must be >= 1");
  return a;
}

struct Shape {
  std::string name;
  LlamaConfig text;
  int seq;
};

Shape demo_shape(const Args& a) {  // configs/demo_model/config.json's text model
  Shape s{"demo (hidden 64, 6 layers, 4/2 heads, vocab 832)", {}, a.demo_seq};
  s.text.hidden_size = 64;
  s.text.num_hidden_layers = 6;
  s.text.num_attention_heads = 4;
  s.text.num_key_value_heads = 2;
  s.text.intermediate_size = 128;
  s.text.vocab_size = 832;
  return s;
}

Shape llama_shape(const Args& a) {  // LLaMA proportions: head_dim 64, SwiGLU 8/3 rounded, 32000-token vocabulary
  Shape s{"", {}, a.seq};
  s.text.hidden_size = a.hidden;
  s.text.num_hidden_layers = a.layers;
  s.text.num_attention_heads = a.hidden / 64;
  s.text.num_key_value_heads = a.hidden / 64;
  s.text.intermediate_size = (a.hidden * 8 / 3 + 255) / 256 * 256;
  s.text.vocab_size = 32000;
  s.name = "LLaMA-shaped (hidden " + std::to_string(a.hidden) + ", " + std::to_string(a.layers) + " layers, " +
           std::to_string(a.hidden / 64) + " heads, vocab 32000)";
  return s;
}

// B prompts of `seq` tokens: 32 system, seq - 32 - 40 image-like (routable), 40 question.
ModelInputs prompts(int B, int seq, int64_t vocab, at::Device dev) {
  ModelInputs in;
  in.input_ids = at::randint(3, vocab, {B, seq}, at::kLong);
  in.attention_mask = at::ones({B, seq}, at::kBool);
  in.token_roles = at::full({B, seq}, static_cast<int64_t>(TokenRole::kQuestion), at::kChar);
  in.token_roles.narrow(1, 0, 32).fill_(static_cast<int64_t>(TokenRole::kSystem));
  in.token_roles.narrow(1, 32, seq - 72).fill_(static_cast<int64_t>(TokenRole::kImage));
  in.input_ids = in.input_ids.to(dev);
  in.attention_mask = in.attention_mask.to(dev);
  in.token_roles = in.token_roles.to(dev);
  return in;
}

struct Figures {
  double prefill = 1e30, next = 1e30, total = 1e30;  // wall-clock seconds (GenerateResult): fastest of the reps
  double prefill_cpu = 1e30, total_cpu = 1e30;       // process CPU seconds of a 1-token and a full generate
  int64_t new_tokens = 0, steps = 0;
  int64_t mod_layer_steps = 0, mod_layer_steps_idle = 0;  // decode steps x MoD layers; those no sample entered
  ComputeReport prefill_compute, all_compute;
  double next_cpu() const { return (total_cpu - prefill_cpu) / std::max<int64_t>(steps, 1); }
};

double cpu_seconds() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

Figures measure(MultimodalLM& model, const ModelInputs& in, int new_tokens, int reps) {
  GenerateOptions o1, o;
  o1.eos_token_id = o.eos_token_id = -1;  // every sample generates new_tokens
  o1.max_new_tokens = 1;                  // the prefill alone (its report, its CPU time)
  o.max_new_tokens = new_tokens;
  Figures f;
  f.prefill_compute = generate(model, in, o1).compute;
  generate(model, in, o);  // warm-up
  for (int r = 0; r < reps; ++r) {
    double c0 = cpu_seconds();
    generate(model, in, o1);
    f.prefill_cpu = std::min(f.prefill_cpu, cpu_seconds() - c0);
    c0 = cpu_seconds();
    auto res = generate(model, in, o);
    f.total_cpu = std::min(f.total_cpu, cpu_seconds() - c0);
    f.prefill = std::min(f.prefill, res.prefill_seconds);
    f.next = std::min(f.next, res.decode_seconds / std::max<int64_t>(res.decode_steps, 1));
    f.total = std::min(f.total, res.prefill_seconds + res.decode_seconds);
    f.new_tokens = res.lengths.sum().item<int64_t>();
    f.steps = res.decode_steps;
    f.all_compute = res.compute;
    f.mod_layer_steps = f.mod_layer_steps_idle = 0;
    const size_t n_layers = model.llm->layers->size();
    for (size_t i = n_layers; i < res.layer_tokens.size(); ++i)  // after the prefill's entries
      if (res.layer_tokens[i].routable >= 0) {
        ++f.mod_layer_steps;
        f.mod_layer_steps_idle += res.layer_tokens[i].processed == 0;
      }
  }
  return f;
}

void print_row(const char* what, double t_dense, double t_mod, double flops, double dense_flops, const char* unit,
               double scale) {
  const double real = 1.0 - t_mod / t_dense, theo = 1.0 - flops / dense_flops;
  std::printf("  %-22s dense %9.2f %s  γ-MoD %9.2f %s  time saving %6.1f%%  FLOP saving %5.1f%%  realised %5.2f\n",
              what, scale * t_dense, unit, scale * t_mod, unit, 100 * real, 100 * theo, theo > 0 ? real / theo : 0.0);
}

}  // namespace

const char* const kUsage =
    "usage: bench_decode [--new 64] [--reps 3] [--batches 1,8,16] [--hidden 1024] [--layers 12] [--seq 320]\n"
    "                    [--demo-seq 320] [--only demo|llama] [--cuda]\n"
    "Generation speed, dense vs γ-MoD: prefill ms and next-token ms at batch 1 (as gamma_mod/eval/model_speed.py)\n"
    "and batched, the FLOP saving of what was computed and the fraction of it realised in time, for the demo\n"
    "model's shape and a larger LLaMA-shaped one.\n";

int main(int argc, char** argv) {
  if (gmod::bench_help(argc, argv, kUsage)) return 0;
  Args a;
  try {
    a = parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_decode: error: %s (--help lists the options)\n", e.what());
    return 2;
  }
  const at::Device dev = a.cuda ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  std::vector<Shape> shapes;
  if (a.only != "llama") shapes.push_back(demo_shape(a));
  if (a.only != "demo") shapes.push_back(llama_shape(a));
  for (const auto& s : shapes) {
    MoDConfig gamma;
    for (int i = 1; i + 1 < s.text.num_hidden_layers; ++i) gamma.mod_layers.push_back(i);
    gamma.infer_threshold = 0.5;
    gamma.decode_threshold = 0.5;
    std::printf("\n== %s, prompt %d tokens (%d routable), %d new tokens, γ-MoD on %zu layers, %s\n", s.name.c_str(),
                s.seq, s.seq - 40, a.new_tokens, gamma.mod_layers.size(), a.cuda ? "cuda" : "cpu");
    for (int B : a.batches) {
      at::manual_seed(0);
      const auto in = prompts(B, s.seq, s.text.vocab_size, dev);
      Figures f[2];
      for (int variant : {1, 0}) {
        LlavaConfig c;
        c.text = s.text;
        auto model = std::make_shared<MultimodalLM>(c);
        model->init_weights(1);
        model->to(dev);
        if (variant == 1) {
          convert_to_mod(*model, gamma);
          at::NoGradGuard ng;
          shared_router(*model)->weight.mul_(20.0);
        }
        model->eval();
        f[variant] = measure(*model, in, a.new_tokens, a.reps);
      }
      const auto& pm = f[1].prefill_compute;
      const auto& am = f[1].all_compute;
      // A decode step's matmuls read the layer's weights whether 1 or B samples go through them: in time, a MoD
      // layer saves its weight reads only at steps where no sample enters it.
      std::printf(" batch %d: γ-MoD layers skipped %.1f%% of prefill and %.1f%% of all token evaluations; "
                  "%.1f%% of decode (step, MoD layer) pairs ran no sample\n",
                  B, 100 * pm.mod_skip_ratio(), 100 * am.mod_skip_ratio(),
                  100.0 * f[1].mod_layer_steps_idle / std::max<int64_t>(f[1].mod_layer_steps, 1));
      // Dense FLOPs of the same tokens: the γ-MoD run's dense reference (the dense model computes exactly that).
      const double df = am.flops - pm.flops, ddf = am.dense_flops - pm.dense_flops;  // the decode steps'
      print_row("prefill (wall)", f[0].prefill, f[1].prefill, pm.flops, pm.dense_flops, "ms", 1e3);
      print_row("next token (wall)", f[0].next, f[1].next, df, ddf, "ms", 1e3);
      if (!a.cuda) {  // CPU time: what the host computed, whatever else the machine ran meanwhile
        print_row("prefill (cpu)", f[0].prefill_cpu, f[1].prefill_cpu, pm.flops, pm.dense_flops, "ms", 1e3);
        print_row("next token (cpu)", f[0].next_cpu(), f[1].next_cpu(), df, ddf, "ms", 1e3);
      }
      const double tps[2] = {f[0].new_tokens / f[0].total, f[1].new_tokens / f[1].total};
      std::printf("  %-22s dense %9.1f tok/s  γ-MoD %9.1f tok/s (new tokens / whole generate, as model_speed.py)\n",
                  "generate", tps[0], tps[1]);
    }
  }
  return 0;
}

// Generation speed, dense vs γ-MoD side by side in one run: prefill time and next-token time at batch 1 (as the
// official gamma_mod/eval/model_speed.py measures it: one prompt, greedy, 64 new tokens, repeated, new tokens per
// second of whole generate calls) and batched (8 and 16 samples), the FLOP saving of what was computed (the
// generation's ComputeReport against the same generation without MoD, LM head included) and the fraction of that
// saving realised in wall-clock time. Times come from GenerateResult (prefill_seconds, decode_seconds /
// decode_steps); each figure is the fastest of --reps runs after a warm-up (a shared machine only ever adds time).
// On the CPU the same figures also in process CPU time (std::clock, read in GenerateOptions::on_step: up to the
// first token for the prefill, from the first token to the last per decode step), which a loaded machine disturbs
// far less than wall-clock (run it with OMP_NUM_THREADS=1 there).
// The floor (unless --no-floor): each part of a decode step is timed on its own in the same run, on the γ-MoD
// model — a dense layer's step at B rows, a MoD layer's step at each P of 0..B rows processing (a dense layer on P
// rows: what the hardware allows; the γ-MoD layer itself: router, host copy, gathers included), the rest of the
// step (embedding, final norm, LM head, argmax) — and the γ-MoD next-token time predicted from the P of every
// (decode step, MoD layer) pair the generation recorded: the dense step measured, less what each MoD layer saves
// at its P. Measured against that floor: the fraction of the achievable saving realised.
// Two model shapes: the demo model's (configs/demo_model: hidden 64, 6 layers) and a larger LLaMA-shaped one
// (--hidden, --layers; 32000-token vocabulary). Random weights; the prompt is a system span, an image-like
// routable span and a question (the LLaVA layout); γ-MoD on every layer but the first and last, its shared router
// spread (x20) so that decisions differ between samples and steps, thresholds 0.5 at prefill and decode.
//   bench_decode [--new 64] [--reps 3] [--batches 1,8,16] [--hidden 1024] [--layers 12] [--seq 320]
//                [--demo-seq 320] [--only demo|llama] [--cuda] [--no-floor]
#include <ATen/ATen.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <tuple>
#include <cstdio>
#include <ctime>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_help.h"
#include "mod/conversion.h"
#include "mod/generate.h"
#include "mod/mod_layer.h"
#include "model/decoder_layer.h"
#include "model/token_roles.h"

using namespace gmod;

namespace {

struct Args {
  int new_tokens = 64, reps = 3, hidden = 1024, layers = 12, seq = 320, demo_seq = 320;
  std::vector<int> batches{1, 8, 16};
  std::string only;
  bool cuda = false;
  bool floor = true;  // --no-floor: skip the calibration of the parts of a decode step
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
    else if (o == "--no-floor") a.floor = false;
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
  double prefill_cpu = 1e30, next_cpu = 1e30;        // process CPU seconds of the prefill, of a decode step
  int64_t new_tokens = 0, steps = 0;
  int64_t mod_layer_steps = 0, mod_layer_steps_idle = 0;  // decode steps x MoD layers; those no sample entered
  std::vector<int64_t> p_hist;      // decode (step, MoD layer) pairs by the number P of samples that entered
  double mod_cache_len = 0;         // MoD layers' mean cached tokens per sample, halfway through the decode
  ComputeReport prefill_compute, all_compute;
};

double cpu_seconds() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

Figures measure(MultimodalLM& model, const ModelInputs& in, int new_tokens, int reps) {
  GenerateOptions o1, o;
  o1.eos_token_id = o.eos_token_id = -1;  // every sample generates new_tokens
  o1.max_new_tokens = 1;                  // the prefill alone (its report; the warm-up)
  o.max_new_tokens = new_tokens;
  std::vector<double> cpu_at;  // process CPU seconds when each step's tokens were chosen
  o.on_step = [&](int64_t, const at::Tensor&) {
    cpu_at.push_back(cpu_seconds());
    return true;
  };
  Figures f;
  f.prefill_compute = generate(model, in, o1).compute;
  for (int r = 0; r < reps; ++r) {
    cpu_at.clear();
    const double c0 = cpu_seconds();
    auto res = generate(model, in, o);
    // Up to the first token: the prefill; from the first token to the last: the decode steps.
    f.prefill_cpu = std::min(f.prefill_cpu, cpu_at.front() - c0);
    f.next_cpu = std::min(f.next_cpu, (cpu_at.back() - cpu_at.front()) / std::max<size_t>(cpu_at.size() - 1, 1));
    f.prefill = std::min(f.prefill, res.prefill_seconds);
    f.next = std::min(f.next, res.decode_seconds / std::max<int64_t>(res.decode_steps, 1));
    f.total = std::min(f.total, res.prefill_seconds + res.decode_seconds);
    f.new_tokens = res.lengths.sum().item<int64_t>();
    f.steps = res.decode_steps;
    f.all_compute = res.compute;
    f.mod_layer_steps = f.mod_layer_steps_idle = 0;
    const int64_t B = in.input_ids.size(0);
    f.p_hist.assign(B + 1, 0);
    const size_t n_layers = model.llm->layers->size();
    int64_t n_mod = 0, prefill_kept = 0, decode_kept = 0;
    for (size_t i = 0; i < res.layer_tokens.size(); ++i) {
      const auto& lt = res.layer_tokens[i];
      if (lt.routable < 0) continue;
      if (i < n_layers) {  // the prefill's entries
        ++n_mod;
        prefill_kept += lt.processed;
        continue;
      }
      ++f.mod_layer_steps;
      f.mod_layer_steps_idle += lt.processed == 0;
      ++f.p_hist.at(lt.processed);
      decode_kept += lt.processed;
    }
    if (n_mod > 0) f.mod_cache_len = (prefill_kept + 0.5 * decode_kept) / static_cast<double>(n_mod * B);
  }
  return f;
}

void print_row(const char* what, double t_dense, double t_mod, double flops, double dense_flops, const char* unit,
               double scale) {
  const double real = 1.0 - t_mod / t_dense, theo = 1.0 - flops / dense_flops;
  std::printf("  %-22s dense %9.2f %s  γ-MoD %9.2f %s  time saving %6.1f%%  FLOP saving %5.1f%%  realised %5.2f\n",
              what, scale * t_dense, unit, scale * t_mod, unit, 100 * real, 100 * theo, theo > 0 ? real / theo : 0.0);
}

// ---- The floor these routing decisions allow on this machine ------------------------------------------
// Each part of a decode step is timed on its own in the same run (fastest of `reps` after a warm-up): a dense
// layer's decode step at n rows over a cache of T tokens per sample, the γ-MoD layer's decode step at batch B
// with exactly P samples processing (the others enter as padding: the router and the host copy run for all B,
// the matmuls for P), and the rest of a step (embedding, final norm, LM head, argmax, the step's mask and host
// copy).

void sync(at::Device d) {
  if (d.is_cuda()) torch::cuda::synchronize();
}

// Wall-clock and process CPU seconds, each the fastest of `reps` runs after a warm-up.
struct Cost {
  double wall = 0, cpu = 0;
};

template <class F>
Cost fastest(int reps, at::Device d, F&& fn) {
  fn();
  sync(d);
  Cost best{1e30, 1e30};
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_seconds();
    fn();
    sync(d);
    best.cpu = std::min(best.cpu, cpu_seconds() - c0);
    best.wall =
        std::min(best.wall, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// A cache of n samples with lens[b] tokens each (slot views with room to write), random content.
KVCache make_cache(const std::vector<int64_t>& lens, const AttentionImpl& attn, at::TensorOptions o,
                   bool per_sample) {
  const int64_t n = static_cast<int64_t>(lens.size()), T = *std::max_element(lens.begin(), lens.end());
  KVCache c;
  c.k = at::randn({n, attn.n_kv_heads, T + 4, attn.head_dim}, o).narrow(2, 0, T);
  c.v = at::randn({n, attn.n_kv_heads, T + 4, attn.head_dim}, o).narrow(2, 0, T);
  if (per_sample) {
    auto l = at::empty({n}, at::kLong);
    std::copy(lens.begin(), lens.end(), l.data_ptr<int64_t>());
    c.lengths = l.to(o.device());
  }
  return c;
}

// Per-sample cache lengths around `mean` (MoD layers' differ per sample: attention is then masked).
std::vector<int64_t> spread_lengths(int64_t n, double mean) {
  std::vector<int64_t> l(n);
  for (int64_t b = 0; b < n; ++b) l[b] = std::max<int64_t>(1, std::llround(mean) + (b % 5) - 2);
  return l;
}

// One decode step of a dense layer: n rows over caches of T tokens (0 rows: nothing runs).
Cost time_dense_layer(DecoderBlock& layer, const AttentionImpl& attn, const RotaryEmbedding& rope, int64_t n,
                      int64_t T, int64_t D, at::TensorOptions o, int reps) {
  if (n == 0) return {};
  std::vector<KVCache> caches{make_cache(std::vector<int64_t>(n, T), attn, o, false)};
  const KVCache saved = caches[0];
  const auto lo = o.dtype(at::kLong);
  ForwardState st;
  st.rope = &rope;
  st.positions = at::full({n, 1}, T, lo);
  std::tie(st.cos, st.sin) = rope.cos_sin(st.positions, o.dtype().toScalarType());
  st.key_valid = at::ones({n, T + 1}, lo.dtype(at::kBool));
  st.mask = AttentionMask::causal(st.key_valid, 1, T + 1, T);
  st.valid_tokens = n;
  st.caches = &caches;
  const auto h = at::randn({n, 1, D}, o);
  return fastest(reps, o.device(), [&] {
    caches[0] = saved;
    st.tokens.clear();
    layer.forward(h, st, 0);
  });
}

// One decode step of a γ-MoD layer at batch B with exactly P samples processing: the first P (contiguous) or
// spread evenly over the batch (scattered: runs of one sample when P <= B / 2), per-sample caches around
// `lm`.
Cost time_mod_layer(MoDDecoderLayer& layer, const RotaryEmbedding& rope, int64_t B, int64_t P, double lm,
                    bool scattered, int64_t D, at::TensorOptions o, int reps) {
  const auto lens = spread_lengths(B, lm);
  std::vector<KVCache> caches{make_cache(lens, *layer.self_attn, o, true)};
  const KVCache saved = caches[0];
  const int64_t T = caches[0].length();
  const auto lo = o.dtype(at::kLong);
  ForwardState st;
  st.rope = &rope;
  st.positions = at::full({B, 1}, T, lo);
  st.key_valid = at::ones({B, T + 1}, lo.dtype(at::kBool));
  auto roles = at::full({B, 1}, static_cast<int64_t>(TokenRole::kPad), at::kChar);
  for (int64_t i = 0; i < P; ++i)
    roles[scattered ? i * B / P : i][0] = static_cast<int64_t>(TokenRole::kAnswer);
  st.token_roles = roles.to(o.device());
  st.valid_tokens = P;
  st.caches = &caches;
  const auto h = at::randn({B, 1, D}, o);
  const double threshold = layer.cfg.decode_threshold;
  layer.cfg.decode_threshold = -1.0;  // every real token passes the router: P is set by the roles
  const Cost t = fastest(reps, o.device(), [&] {
    caches[0] = saved;
    st.tokens.clear();
    layer.forward(h, st, 0);  // its cache is caches[0]
  });
  layer.cfg.decode_threshold = threshold;
  return t;
}

// The rest of a decode step at batch B: embedding, final norm, LM head, argmax, the step's mask and host
// copy.
Cost time_rest(MultimodalLM& model, int64_t B, int64_t T, at::TensorOptions o, int reps) {
  const auto lo = o.dtype(at::kLong);
  const auto ids = at::randint(3, model.config.text.vocab_size, {B}, lo);
  const auto kv = at::ones({B, T + 1}, lo.dtype(at::kBool));
  return fastest(reps, o.device(), [&] {
    auto h = model.llm->norm->forward(model.llm->embed(ids.unsqueeze(1))).select(1, 0);
    auto next = model.logits(h).argmax(-1);
    auto m = AttentionMask::causal(kv, 1, T + 1, T);
    auto host = at::stack({next, next}).cpu();
  });
}

struct Floor {
  std::vector<int64_t> grid;                    // P values calibrated (0..B, thinned above 8)
  std::vector<Cost> floor, mod, mod_scattered;  // one MoD layer-step at each P
  std::vector<Cost> padded;                     // floor at the cheapest row count >= P (P > 0)
  Cost dense_layer, rest;  // a dense layer's step at B rows over the dense cache; the rest
  int dense_layers = 0, mod_layers = 0;
  // Linear interpolation of c over the grid.
  double at(const std::vector<Cost>& c, double Cost::*clock, int64_t P) const {
    for (size_t i = 1; i < grid.size(); ++i)
      if (P <= grid[i])
        return c[i - 1].*clock + (c[i].*clock - c[i - 1].*clock) * static_cast<double>(P - grid[i - 1]) /
                                     static_cast<double>(grid[i] - grid[i - 1]);
    return c.back().*clock;
  }
  // Next-token seconds predicted for the dense model, and for γ-MoD with its MoD layers costing c at the P
  // counts the generation recorded.
  double dense(double Cost::*clock) const {
    return (dense_layers + mod_layers) * dense_layer.*clock + rest.*clock;
  }
  // Seconds per step the MoD layers save against dense layers when each costs c at the P the generation
  // recorded.
  double saving(const std::vector<Cost>& c, double Cost::*clock, const Figures& f) const {
    double mod = 0;
    for (size_t P = 0; P < f.p_hist.size(); ++P) mod += f.p_hist[P] * at(c, clock, static_cast<int64_t>(P));
    return mod_layers * dense_layer.*clock - mod / std::max<int64_t>(f.steps, 1);
  }
};

Floor calibrate(MultimodalLM& model, int64_t B, int64_t dense_len, double mod_len, int reps) {
  at::NoGradGuard ng;
  Floor fl;
  const auto& layers = *model.llm->layers;
  DenseDecoderLayer* dense = nullptr;
  MoDDecoderLayer* mod = nullptr;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (auto* m = dynamic_cast<MoDDecoderLayer*>(layers[i].get())) {
      mod = mod ? mod : m;
      ++fl.mod_layers;
    } else if (auto* d = dynamic_cast<DenseDecoderLayer*>(layers[i].get())) {
      dense = dense ? dense : d;
      ++fl.dense_layers;
    }
  }
  if (!dense || !mod) throw std::logic_error("bench_decode: calibration needs a dense and a MoD layer");
  const auto o = model.lm_head_weight().options();
  const auto& rope = model.llm->rope;
  const int64_t D = model.config.text.hidden_size;
  for (int64_t P = 0; P <= B; P += P < 8 ? 1 : std::max<int64_t>(1, B / 8)) fl.grid.push_back(P);
  if (fl.grid.back() != B) fl.grid.push_back(B);
  for (int64_t P : fl.grid) {
    fl.floor.push_back(
        time_dense_layer(*dense, *dense->self_attn, rope, P, std::llround(mod_len), D, o, reps));
    fl.mod.push_back(time_mod_layer(*mod, rope, B, P, mod_len, false, D, o, reps));
    fl.mod_scattered.push_back(time_mod_layer(*mod, rope, B, P, mod_len, true, D, o, reps));
  }
  // A layer may also run more rows than enter it and discard the rest: the cheapest row count >= P.
  fl.padded = fl.floor;
  for (size_t i = fl.grid.size() - 1; i-- > 1;) {
    fl.padded[i].wall = std::min(fl.padded[i].wall, fl.padded[i + 1].wall);
    fl.padded[i].cpu = std::min(fl.padded[i].cpu, fl.padded[i + 1].cpu);
  }
  fl.dense_layer = time_dense_layer(*dense, *dense->self_attn, rope, B, dense_len, D, o, reps);
  fl.rest = time_rest(model, B, dense_len, o, reps);
  return fl;
}

// Measured next-token time against the floor: what a step would cost if each MoD layer cost what a dense
// layer costs on only the P rows that entered it (the hardware's floor for these routing decisions), and what
// it costs at the MoD layer's own measured cost at P (router, host copy, gathers included; contiguous and
// scattered processors).
void print_floor(const Floor& fl, const Figures& fd, const Figures& fm, double flops, double dense_flops,
                 bool cpu) {
  const double theo = 1.0 - flops / dense_flops;
  for (double Cost::*clock : {&Cost::wall, &Cost::cpu}) {
    const bool wall = clock == &Cost::wall;
    if (!wall && !cpu) break;
    const char* name = wall ? "wall" : "cpu";
    std::printf(
        "  floor (%s): step parts (ms, fastest of the calibration runs): dense layer at B %.2f, rest (embed, "
        "norm, head, argmax, mask, host copy) %.2f; %d dense + %d MoD layers\n",
        name, 1e3 * fl.dense_layer.*clock, 1e3 * fl.rest.*clock, fl.dense_layers, fl.mod_layers);
    std::printf("    MoD layer-step ms at P =     ");
    for (auto P : fl.grid) std::printf(" %6lld", static_cast<long long>(P));
    auto row = [&](const char* what, const std::vector<Cost>& c) {
      std::printf("\n    %-28s", what);
      for (const auto& t : c) std::printf(" %6.2f", 1e3 * t.*clock);
    };
    row("floor (dense layer, P rows)", fl.floor);
    row("floor, rows padded up", fl.padded);
    row("γ-MoD layer, P contiguous", fl.mod);
    row("γ-MoD layer, P scattered", fl.mod_scattered);
    const double md = wall ? fd.next : fd.next_cpu, mm = wall ? fm.next : fm.next_cpu;
    // γ-MoD's step = the dense step measured less what its MoD layers save (what else a step does is the
    // same).
    const double pd = fl.dense(clock), pf = md - fl.saving(fl.floor, clock, fm),
                 pc = md - fl.saving(fl.mod, clock, fm), ps = md - fl.saving(fl.mod_scattered, clock, fm),
                 pp = md - fl.saving(fl.padded, clock, fm);
    const double meas = 1.0 - mm / md, achievable = 1.0 - pf / md;
    std::printf(
        "\n    next token ms: dense measured %.2f (sum of its parts %.2f); γ-MoD measured %.2f (sum of its "
        "parts "
        "%.2f), floor for these decisions %.2f (at the γ-MoD layer's own cost: contiguous %.2f, scattered "
        "%.2f; rows padded up %.2f)\n",
        1e3 * md, 1e3 * pd, 1e3 * mm, 1e3 * (pd - (md - pf)), 1e3 * pf, 1e3 * pc, 1e3 * ps, 1e3 * pp);
    std::printf(
        "    achievable time saving %.1f%% (%.2f of the FLOP saving), measured %.1f%%: "
        "realised-of-achievable "
        "%.2f\n",
        100 * achievable, theo > 0 ? achievable / theo : 0.0, 100 * meas,
        achievable > 0 ? meas / achievable : 0.0);
  }
  std::printf("    decode (step, MoD layer) pairs by P:");
  for (size_t P = 0; P < fm.p_hist.size(); ++P)
    if (fm.p_hist[P]) std::printf(" %zu:%lld", P, static_cast<long long>(fm.p_hist[P]));
  std::printf("\n");
}

}  // namespace

const char* const kUsage =
    "usage: bench_decode [--new 64] [--reps 3] [--batches 1,8,16] [--hidden 1024] [--layers 12] [--seq 320]\n"
    "                    [--demo-seq 320] [--only demo|llama] [--cuda] [--no-floor]\n"
    "Generation speed, dense vs γ-MoD: prefill ms and next-token ms at batch 1 (as gamma_mod/eval/model_speed.py)\n"
    "and batched, the FLOP saving of what was computed and the fraction of it realised in time, for the demo\n"
    "model's shape and a larger LLaMA-shaped one; and the floor the recorded routing decisions allow (each part of\n"
    "a decode step timed on its own; --no-floor skips it).\n";

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
      Floor fl;
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
        if (variant == 1 && a.floor)  // the same model, the cache lengths the generation had halfway through
          fl = calibrate(*model, B, s.seq + f[1].steps / 2, f[1].mod_cache_len, std::max(a.reps, 9));
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
        print_row("next token (cpu)", f[0].next_cpu, f[1].next_cpu, df, ddf, "ms", 1e3);
      }
      if (a.floor) print_floor(fl, f[0], f[1], df, ddf, !a.cuda);
      const double tps[2] = {f[0].new_tokens / f[0].total, f[1].new_tokens / f[1].total};
      std::printf("  %-22s dense %9.1f tok/s  γ-MoD %9.1f tok/s (new tokens / whole generate, as model_speed.py)\n",
                  "generate", tps[0], tps[1]);
    }
  }
  return 0;
}

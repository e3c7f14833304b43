// Mixture-of-Depths speed: forward+backward step time and prefill time of a model with MoD on most
// layers (all but the first and last) at skip_frac 0.5 of the routable tokens, against the dense
// model, next to the theoretical FLOP ratio from the accounting. Random weights, text-only inputs
// with image-like routable spans.
//   bench_mod [--hidden 512] [--layers 8] [--seq 512] [--batch 4] [--iters 3] [--routable 5/8 seq] [--cuda]
#include <ATen/ATen.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "bench/mod_savings.h"
#include "mod/accounting.h"
#include "mod/conversion.h"
#include "model/token_roles.h"

using namespace gmod;

namespace {

struct Args {
  int hidden = 512, layers = 8, seq = 512, batch = 4, iters = 3, routable = 0;  // 0: 5/8 of seq
  bool cuda = false;
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
    else throw std::invalid_argument(std::string("unknown option ") + argv[i]);
  }
  if (a.routable == 0) a.routable = a.seq * 5 / 8;
  if (a.routable < 33 || a.routable > a.seq) throw std::invalid_argument("--routable must be in [33, seq]");
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
  m->to(dev);
  return m;
}

ModelInputs make_inputs(const Args& a, at::Device dev) {
  ModelInputs in;
  in.input_ids = at::randint(3, 1000, {a.batch, a.seq}, at::kLong);
  in.labels = in.input_ids.clone();
  in.token_roles = at::full({a.batch, a.seq}, static_cast<int64_t>(TokenRole::kAnswer), at::kChar);
  in.token_roles.narrow(1, 0, 32).fill_(static_cast<int64_t>(TokenRole::kSystem));
  in.token_roles.narrow(1, 32, a.routable - 32).fill_(static_cast<int64_t>(TokenRole::kImage));
  in.token_roles.narrow(1, a.routable, std::min(64, a.seq - a.routable)).fill_(static_cast<int64_t>(TokenRole::kQuestion));
  in.input_ids = in.input_ids.to(dev);
  in.labels = in.labels.to(dev);
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

int main(int argc, char** argv) {
  Args a = parse(argc, argv);
  const at::Device dev = a.cuda ? at::Device(at::kCUDA) : at::Device(at::kCPU);
  auto in = make_inputs(a, dev);
  MoDConfig cfg;
  for (int i = 1; i + 1 < a.layers; ++i) cfg.mod_layers.push_back(i);
  cfg.skip_frac = 0.5;
  cfg.mode = RoutingMode::kTopK;  // the same static capacity for training and prefill

  double times[2][2];
  ComputeReport rep;
  for (int variant = 0; variant < 2; ++variant) {
    auto model = make_model(a, dev);
    if (variant == 1) convert_to_mod(*model, cfg);
    times[variant][0] = time_it(a.iters, a.cuda, [&] {
      model->zero_grad();
      ForwardState st;
      auto out = model->forward(in, st);
      auto loss = out.lm_loss;
      auto aux = total_routing_loss(st, cfg);
      if (aux.defined()) loss = loss + aux;
      loss.backward();
    });
    times[variant][1] = time_it(a.iters, a.cuda, [&] {
      at::NoGradGuard ng;
      ForwardState st;
      model->forward(in, st);
      if (variant == 1) rep = account_compute(st.tokens, model->config.text, std::vector<int64_t>(a.batch, a.seq));
    });
  }
  std::printf("config: hidden %d, layers %d (MoD %zu), seq %d, batch %d, routable %d, skip_frac 0.5, %s\n", a.hidden,
              a.layers, cfg.mod_layers.size(), a.seq, a.batch, a.routable, a.cuda ? "cuda" : "cpu");
  std::printf("%s", rep.table().c_str());
  const double theo = 1.0 - rep.flop_ratio();  // decoder FLOPs only (no embeddings / LM head)
  const char* names[2] = {"fwd+bwd step", "prefill"};
  for (int k = 0; k < 2; ++k) {
    const double real = 1.0 - times[1][k] / times[0][k];
    std::printf("%-13s dense %8.1f ms  mod %8.1f ms  realised saving %5.1f%% / theoretical saving %5.1f%% = %.2f\n",
                names[k], 1e3 * times[0][k], 1e3 * times[1][k], 100 * real, 100 * theo, theo > 0 ? real / theo : 0.0);
  }
  {  // realised against theoretical on the trainer's FLOP formula, and batched decode (bench/mod_savings.h)
    auto model = make_model(a, dev);
    convert_to_mod(*model, cfg);
    bench::print_train_flop_saving(*model, in, times[0][0], times[1][0]);
    bench::bench_decode([&] { return make_model(a, dev); }, cfg, in, 16, a.cuda);
  }
  return 0;
}

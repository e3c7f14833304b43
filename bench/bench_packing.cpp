// Sequence packing against padded batches: real (non-pad) tokens per second of a training step (forward + backward
// of the LM loss and the routing loss) and the padding fraction, for padded random micro-batches, LLaVA's
// group_by_modality_length (the sampler's, with LLaVA's megabatch of world x micro-batch samples: --world), packed
// micro-batches in rows of --pack-to tokens and packed into one row each, dense and γ-MoD (shared router on every
// layer but the first and last, skip 0.5), the same model, samples and micro-batch count in one run. Batches are made
// by gmod's own collate / collate_packed (data/pack.h) and fed as the trainer feeds them (to_model_inputs).
// The samples are generated with a length and modality mix shaped like LLaVA-1.5's mix665k: 6% text-only
// conversations (log-normal, median 600 tokens), 94% with one image of 576 tokens plus a log-normal text (median
// 120 tokens, sigma 0.9), at most --max-len tokens; --scale multiplies every length (image tokens included) for a
// quick run. The model is a random LLaMA-shaped decoder (--hidden, --layers); image tokens are token ids with the image
// role (the vision tower is outside what packing changes).
//   bench_packing [--micro-batch 16] [--micro-batches 6] [--world 8] [--pack-to 4096] [--max-len 2048]
//                 [--scale 1] [--hidden 128] [--layers 4] [--threads 0] [--seed 1]
#include <ATen/ATen.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "bench/bench_help.h"
#include "data/pack.h"
#include "data/sampler.h"
#include "mod/conversion.h"
#include "model/lm_loss.h"
#include "model/token_roles.h"

using namespace gmod;

namespace {

const char* kUsage =
    "Real tokens/s and padding fraction of a training step, padded (random, grouped by modality length) vs\n"
    "packed (rows of --pack-to, one row), dense and gamma-MoD, same model and samples, one run.\n"
    "Usage: bench_packing [--micro-batch 16] [--micro-batches 6] [--world 8] [--pack-to 4096] [--max-len 2048]\n"
    "                     [--scale 1] [--hidden 128] [--layers 4] [--threads 0] [--seed 1]\n";

struct Args {
  int mb = 16, batches = 6, world = 8, hidden = 128, layers = 4, threads = 0;
  int64_t pack_to = 4096, max_len = 2048;
  double scale = 1.0;
  uint64_t seed = 1;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument("missing value for " + k);
    const std::string v = argv[++i];
    if (k == "--micro-batch") a.mb = std::stoi(v);
    else if (k == "--micro-batches") a.batches = std::stoi(v);
    else if (k == "--world") a.world = std::stoi(v);
    else if (k == "--pack-to") a.pack_to = std::stoll(v);
    else if (k == "--max-len") a.max_len = std::stoll(v);
    else if (k == "--scale") a.scale = std::stod(v);
    else if (k == "--hidden") a.hidden = std::stoi(v);
    else if (k == "--layers") a.layers = std::stoi(v);
    else if (k == "--threads") a.threads = std::stoi(v);
    else if (k == "--seed") a.seed = std::stoull(v);
    else throw std::invalid_argument("unknown option " + k);
  }
  if (a.mb < 1 || a.batches < 1 || a.world < 1 || a.layers < 3 || a.scale <= 0)
    throw std::invalid_argument("need --micro-batch, --micro-batches, --world >= 1, --layers >= 3, --scale > 0");
  return a;
}

constexpr int32_t kImageId = 250, kVocab = 256;

// One generated sample: system, image (or none), question half and answer half, as the data pipeline tokenises.
PreparedSample make_sample(size_t index, std::mt19937_64& rng, const Args& a) {
  std::uniform_real_distribution<double> u(0, 1);
  const bool text_only = u(rng) < 0.06;
  std::lognormal_distribution<double> text_len(std::log(text_only ? 600.0 : 120.0), text_only ? 0.7 : 0.9);
  const int64_t sys = std::max<int64_t>(1, std::llround(8 * a.scale));
  const int64_t img = text_only ? 0 : std::max<int64_t>(1, std::llround(576 * a.scale));
  const int64_t max_len = std::max<int64_t>(sys + img + 2, std::llround(a.max_len * a.scale));
  const int64_t text = std::clamp<int64_t>(std::llround(text_len(rng) * a.scale), 2, max_len - sys - img);
  PreparedSample p;
  auto& s = p.sample;
  s.index = index;
  s.id = std::to_string(index);
  std::uniform_int_distribution<int32_t> tok(3, kImageId - 1);
  for (int64_t i = 0; i < sys + img + text; ++i) {
    const bool is_img = i >= sys && i < sys + img;
    const bool answer = i >= sys + img + text / 2;
    s.ids.push_back(is_img ? kImageId : tok(rng));
    s.labels.push_back(answer ? s.ids.back() : kIgnoreIndex);
    s.roles.push_back(i < sys ? TokenRole::kSystem
                              : is_img ? TokenRole::kImage : answer ? TokenRole::kAnswer : TokenRole::kQuestion);
  }
  return p;
}

std::shared_ptr<MultimodalLM> make_model(const Args& a, bool mod) {
  LlavaConfig cfg;
  cfg.text.vocab_size = kVocab;
  cfg.text.hidden_size = a.hidden;
  cfg.text.intermediate_size = a.hidden * 11 / 4;
  cfg.text.num_hidden_layers = a.layers;
  cfg.text.num_attention_heads = std::max(1, a.hidden / 32);
  cfg.text.num_key_value_heads = std::max(1, a.hidden / 64);
  cfg.text.max_position_embeddings = static_cast<int>(a.max_len * 2);
  auto m = std::make_shared<MultimodalLM>(cfg);
  m->init_weights(7);
  if (mod) {
    MoDConfig c;
    c.router = RouterKind::kGammaShared;
    c.skip_frac = 0.5;
    for (int l = 1; l + 1 < a.layers; ++l) c.mod_layers.push_back(l);
    convert_to_mod(*m, c);
  }
  m->train();
  return m;
}

struct Figures {
  int64_t real = 0, positions = 0;
  double seconds = 0;
};

Figures run(MultimodalLM& m, const std::vector<Batch>& batches) {
  Figures f;
  for (int pass = 0; pass < 2; ++pass) {  // pass 0 warms up on the first batch only
    for (size_t i = 0; i < (pass == 0 ? 1 : batches.size()); ++i) {
      const Batch& b = batches[i];
      ModelInputs in = to_model_inputs(b, at::kCPU);
      const auto t0 = std::chrono::steady_clock::now();
      m.zero_grad();
      ForwardState st;
      auto out = forward_label_loss(m, in, st);
      at::Tensor loss = out.lm_loss_sum / std::max<int64_t>(out.supervised_tokens, 1);
      for (const auto& r : st.aux_losses) loss = loss + r;
      loss.backward();
      if (pass == 1) {
        f.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        f.real += b.tokens;
        f.positions += b.input_ids.numel();
      }
    }
  }
  return f;
}

std::vector<PreparedSample> take(const std::vector<PreparedSample>& all, const std::vector<size_t>& order,
                                 size_t from, size_t n) {
  std::vector<PreparedSample> out;
  for (size_t k = from; k < from + n; ++k) out.push_back(all[order[k % order.size()]]);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (bench_help(argc, argv, kUsage)) return 0;
  try {
    const Args a = parse(argc, argv);
    if (a.threads > 0) at::set_num_threads(a.threads);
    // A pool of micro-batch x micro-batches x world samples: the grouped order sorts it in megabatches of world x
    // micro-batch samples (LLaVA's), of which micro-batch b takes rank (b mod world)'s slice of megabatch b, so the
    // grouped batches span long to short as a rank's do; the other strategies take the first micro-batches of one
    // seeded random order (the same samples for padded and packed).
    const size_t n = size_t(a.mb) * size_t(a.batches) * size_t(a.world);
    std::mt19937_64 rng(a.seed);
    std::vector<PreparedSample> samples;
    std::vector<int64_t> modality;  // LLaVA's modality lengths: + with an image, - text-only
    int64_t text_only = 0, total = 0;
    for (size_t i = 0; i < n; ++i) {
      samples.push_back(make_sample(i, rng, a));
      const auto len = static_cast<int64_t>(samples.back().sample.ids.size());
      const auto& roles = samples.back().sample.roles;
      const bool img = std::find(roles.begin(), roles.end(), TokenRole::kImage) != roles.end();
      modality.push_back(img ? len : -len);
      text_only += img ? 0 : 1;
      total += len;
    }
    const int64_t pack_to = std::max<int64_t>(a.pack_to, std::llround(a.max_len * a.scale));
    std::printf("samples %zu (%.1f%% text-only), mean %.0f tokens; micro-batch %d x %d micro-batches; pack_to %lld; "
                "model hidden %d, %d layers; threads %d\n",
                n, 100.0 * double(text_only) / double(n), double(total) / double(n), a.mb, a.batches,
                static_cast<long long>(pack_to), a.hidden, a.layers, at::get_num_threads());

    // The same micro-batch slots for every strategy: random order (padded, packed) or grouped order.
    const auto random = seeded_permutation(n, a.seed, 0);
    SamplerConfig sc{a.seed, int64_t(a.mb) * a.world, true, 0};
    const auto grouped = epoch_order(n, sc, 0, modality);
    struct Strategy {
      const char* name;
      std::vector<Batch> batches;
    };
    std::vector<Strategy> strategies(4);
    strategies[0].name = "padded, random";
    strategies[1].name = "padded, group_by_modality_length";
    strategies[2].name = "packed, rows of pack_to";
    strategies[3].name = "packed, one row";
    for (int b = 0; b < a.batches; ++b) {
      const size_t from = size_t(b) * size_t(a.mb);
      auto r = take(samples, random, from, size_t(a.mb));
      strategies[0].batches.push_back(collate(r, 0, 0));
      auto g = take(samples, grouped, (size_t(b) * size_t(a.world) + size_t(b % a.world)) * size_t(a.mb), size_t(a.mb));
      strategies[1].batches.push_back(collate(g, 0, 0));
      auto p = take(samples, random, from, size_t(a.mb));
      strategies[2].batches.push_back(collate_packed(p, 0, 0, pack_to));
      auto o = take(samples, random, from, size_t(a.mb));
      strategies[3].batches.push_back(collate_packed(o, 0, 0, std::max<int64_t>(pack_to, total)));
    }
    for (bool mod : {false, true}) {
      auto model = make_model(a, mod);
      std::printf("\n%s\n%-34s %10s %10s %9s %12s %14s\n", mod ? "gamma-MoD (skip 0.5, layers 1..L-2)" : "dense",
                  "batches", "real", "computed", "padding", "real tok/s", "vs grouped");
      std::vector<Figures> figs;
      for (const auto& s : strategies) figs.push_back(run(*model, s.batches));
      const double grouped_rate = double(figs[1].real) / figs[1].seconds;
      for (size_t i = 0; i < strategies.size(); ++i) {
        const auto& f = figs[i];
        const double rate = double(f.real) / f.seconds;
        std::printf("%-34s %10lld %10lld %8.1f%% %12.0f %13.2fx\n", strategies[i].name,
                    static_cast<long long>(f.real), static_cast<long long>(f.positions),
                    100.0 * double(f.positions - f.real) / double(f.positions), rate, rate / grouped_rate);
      }
    }
    std::printf("\nbench_packing done\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_packing: %s\n", e.what());
    return 1;
  }
}

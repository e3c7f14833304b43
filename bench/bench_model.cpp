// Forward+backward step time of gmod's dense model on a Hugging Face checkpoint (or a config-only
// random model), for side-by-side comparison with transformers (bench/compare_transformers.py runs
// both on the same model, batch and thread count and prints the ratio) or with the original LLaVA-HR
// (bench/compare_llava_hr.py: --images 1 puts one image per sample after the first token, its expanded image
// tokens unsupervised; --tower-checkpointing recomputes the tower's units in the backward as the original
// does).
//   bench_model --model DIR [--batch B] [--seq L] [--steps N] [--warmup W] [--threads T] [--dtype fp32|bf16]
//               [--images K] [--tower-checkpointing 0|1]
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "bench/bench_help.h"
#include "model/pretrained.h"

using namespace gmod;

const char* const kUsage =
    "usage: bench_model --model DIR [--batch B] [--seq L] [--steps N] [--warmup W] [--threads T] [--dtype\n"
    "                               fp32|bf16] [--images K] [--tower-checkpointing 0|1]\n"
    "Forward+backward step time of gmod's dense model on a Hugging Face dir\n"
    "(bench/compare_transformers.py runs it next to transformers). --images K: K random images per sample\n"
    "at the model's input size, right after the first token (a LLaVA or LLaVA-HR dir;\n"
    "bench/compare_llava_hr.py runs it next to the original LLaVA-HR). --tower-checkpointing 1: the vision\n"
    "tower recomputes its units (CLIP layers, ConvNeXt stages) in the backward.\n";

int main(int argc, char** argv) {
  if (gmod::bench_help(argc, argv, kUsage)) return 0;
  std::string dir, dtype_s = "fp32";
  int64_t B = 4, L = 128;
  int steps = 5, warmup = 2, threads = 0, images = 0, tower_ckpt = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--model")
      dir = v;
    else if (k == "--batch")
      B = std::stoll(v);
    else if (k == "--seq")
      L = std::stoll(v);
    else if (k == "--steps")
      steps = std::stoi(v);
    else if (k == "--warmup")
      warmup = std::stoi(v);
    else if (k == "--threads")
      threads = std::stoi(v);
    else if (k == "--dtype")
      dtype_s = v;
    else if (k == "--images")
      images = std::stoi(v);
    else if (k == "--tower-checkpointing")
      tower_ckpt = std::stoi(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: bench_model --model DIR [...]\n");
    return 2;
  }
  if (threads > 0) at::set_num_threads(threads);
  const auto dtype = dtype_s == "bf16" ? at::kBFloat16 : at::kFloat;
  auto model = load_pretrained(dir, dtype);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  ModelInputs in;
  in.input_ids = at::randint(3, model->config.text.vocab_size, {B, L}, gen, at::kLong);
  if (images > 0) {
    if (!model->vision) {
      std::fprintf(stderr, "bench_model: --images needs a model with a vision tower (%s has none)\n",
                   dir.c_str());
      return 2;
    }
    const int64_t T = int64_t(images) * model->config.image_seq_length(),
                  S = model->config.image_input_size();
    if (T + 2 > L) {
      std::fprintf(stderr, "bench_model: --seq %lld is too short for %lld image tokens\n", (long long)L,
                   (long long)T);
      return 2;
    }
    in.input_ids.masked_fill_(in.input_ids == model->config.image_token_id, 3);
    in.input_ids.narrow(1, 1, T).fill_(model->config.image_token_id);
    in.labels = in.input_ids.clone();
    in.labels.narrow(1, 0, T + 1).fill_(-100);
    in.pixel_values = at::randn({B * images, 3, S, S}, gen, at::TensorOptions().dtype(dtype));
    model->vision->set_activation_checkpointing(tower_ckpt != 0);
  } else {
    in.labels = in.input_ids.clone();
  }
  std::vector<double> ms;
  double loss = 0;
  for (int s = 0; s < warmup + steps; ++s) {
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    auto t0 = std::chrono::steady_clock::now();
    auto out = model->forward(in);
    out.lm_loss.backward();
    auto t1 = std::chrono::steady_clock::now();
    loss = out.lm_loss.item<double>();
    if (s >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf(
      "gmod  model=%s batch=%lld seq=%lld images=%d dtype=%s threads=%d  median %.1f ms/step  (min %.1f)  "
      "loss %.6f\n",
      dir.c_str(), (long long)B, (long long)L, images, dtype_s.c_str(), at::get_num_threads(),
      ms[ms.size() / 2], ms[0], loss);
  return 0;
}

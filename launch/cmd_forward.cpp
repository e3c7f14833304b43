// `gmod forward`: load a Hugging Face (LLaVA or LLaMA, dense or MoD) checkpoint, run forward+backward on a
// sample and print loss and timing. The sample is the checkpoint's `reference.safetensors` inputs when
// present (the shipped fixtures have one), else random tokens. --check-reference TOL compares the first
// step's loss with the reference's "loss" (written by transformers) and fails when they differ by more than
// TOL.
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <optional>

#include "launch/args.h"
#include "launch/cli_model.h"
#include "mod/mod_checkpoint.h"
#include "model/config.h"
#include "model/lm_loss.h"
#include "model/pretrained.h"
#include "model/safetensors.h"

namespace gmod::cli {
namespace {

struct ForwardOptions {
  std::string model = "tests/fixtures/hf/llava_layer_m2";
  std::string dtype = "fp32";
  std::string device = "cpu";
  int steps = 3;
  int batch = 2;
  int seq = 64;
  int threads = 0;
  std::optional<double> check_reference;
  TowerOverrides towers;
};

int run_forward(const ForwardOptions& o) {
  const auto dtype = o.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  if (o.threads > 0) at::set_num_threads(o.threads);
  const at::Device device(o.device);
  const std::string& dir = o.model;
  set_tower_overrides(o.towers);

  const auto ref_path = (std::filesystem::path(dir) / "reference.safetensors").string();
  // The random batch (no reference.safetensors): its length must fit the model (config.json only, before loading).
  if (!std::filesystem::exists(ref_path)) {
    const int positions = load_model_config(dir).text.max_position_embeddings;
    if (o.seq > positions)
      throw UsageError("--seq " + std::to_string(o.seq) + " is beyond the model's max_position_embeddings (" +
                       std::to_string(positions) + ", " + dir + "/config.json)");
  }
  auto t0 = std::chrono::steady_clock::now();
  auto model = load_mod_pretrained(dir, dtype, device);  // dense or γ-MoD (config.json "mod")
  auto t_load = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ModelInputs in;
  std::optional<double> ref_loss;
  if (std::filesystem::exists(ref_path)) {
    SafetensorsFile ref(ref_path);
    in.input_ids = ref.tensor("input.input_ids").to(device);
    in.attention_mask = ref.tensor("input.attention_mask").to(at::kBool).to(device);
    in.labels = ref.tensor("input.labels").to(device);
    if (ref.has("input.pixel_values")) in.pixel_values = ref.tensor("input.pixel_values").to(device, dtype);
    if (ref.has("loss")) ref_loss = ref.tensor("loss").to(at::kDouble).item<double>();
  } else {
    const int64_t B = o.batch, L = o.seq;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
    in.input_ids = at::randint(3, model->config.text.vocab_size, {B, L}, gen, at::kLong).to(device);
    in.labels = in.input_ids.clone();
  }
  if (o.check_reference && !ref_loss)
    throw std::runtime_error("--check-reference: " + ref_path + " is missing or has no \"loss\" tensor");
  int64_t n_params = 0;
  for (auto& p : model->parameters()) n_params += p.numel();
  std::cout << "model " << dir << ": " << n_params << " parameters, " << o.dtype << ", loaded in "
            << t_load * 1e3 << " ms\nbatch " << in.input_ids.size(0) << " x " << in.input_ids.size(1)
            << " tokens"
            << (in.pixel_values.defined() ? ", " + std::to_string(in.pixel_values.size(0)) + " images" : "")
            << "\n";
  double first_loss = NAN;
  for (int s = 0; s < o.steps; ++s) {
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    auto t1 = std::chrono::steady_clock::now();
    ForwardState st;
    ModelOutput out = forward_label_loss(*model, in, st);  // as training computes the loss (model/lm_loss.h)
    auto t2 = std::chrono::steady_clock::now();
    out.lm_loss.backward();
    auto t3 = std::chrono::steady_clock::now();
    double gn = 0;
    for (auto& p : model->parameters())
      if (p.grad().defined()) gn += p.grad().to(at::kDouble).pow(2).sum().item<double>();
    const double loss = out.lm_loss.item<double>();
    if (s == 0) first_loss = loss;
    std::printf("step %d  loss %.6f  grad-norm %.6f  forward %.2f ms  backward %.2f ms\n", s, loss,
                std::sqrt(gn), std::chrono::duration<double, std::milli>(t2 - t1).count(),
                std::chrono::duration<double, std::milli>(t3 - t2).count());
  }
  if (o.check_reference) {
    const double diff = std::abs(first_loss - *ref_loss);
    const bool ok = diff <= *o.check_reference;
    std::printf("reference loss %.6f (%s)  |diff| %.3e  %s %.1e\n", *ref_loss, ref_path.c_str(), diff,
                ok ? "<=" : "> tolerance", *o.check_reference);
    if (!ok) return kExitRuntime;
  }
  return kExitOk;
}

Runner setup_forward(CLI::App& app) {
  auto o = std::make_shared<ForwardOptions>();
  add(app, "--model", o->model, "Hugging Face model dir (dense, or γ-MoD with \"mod\" in config.json)")
      ->type_name("DIR");
  add(app, "--dtype", o->dtype, "weights and compute dtype")->check(CLI::IsMember({"fp32", "bf16"}));
  add(app, "--device", o->device, "cpu, cuda or cuda:N")->check(torch_device());
  add(app, "--steps", o->steps, "forward+backward steps")->check(positive());
  add(app, "--batch", o->batch, "samples of the random batch (without reference.safetensors)")
      ->check(positive());
  add(app, "--seq", o->seq, "tokens per sample of the random batch (without reference.safetensors)")
      ->check(positive());
  add(app, "--threads", o->threads, "CPU threads (0: LibTorch's default)")->check(thread_count());
  add(app, "--check-reference", o->check_reference,
      "compare step 0's loss with reference.safetensors' \"loss\" (transformers); exit 1 when |diff| > TOL")
      ->type_name("TOL")
      ->check(non_negative());
  add_tower_options(app, o->towers);
  return [o] { return run_forward(*o); };
}

Register reg_forward({"forward", "forward+backward of a checkpoint on a sample; prints loss and timing",
                      setup_forward});

}  // namespace
}  // namespace gmod::cli

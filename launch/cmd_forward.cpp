// `gmod forward`: load a Hugging Face (LLaVA or LLaMA, dense or MoD) checkpoint, run forward+backward on a sample
// and print loss and timing. The sample is the checkpoint's `reference.safetensors` inputs when
// present (the shipped fixtures have one), else random tokens.
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <iostream>

#include "launch/args.h"
#include "model/pretrained.h"
#include "model/safetensors.h"
#include "mod/mod_checkpoint.h"

namespace gmod::cli {
namespace {

int run_forward(const std::vector<std::string>& argv) {
  Args a(argv);
  a.check_known({"model", "dtype", "steps", "batch", "seq", "threads", "device"});
  const std::string dir = a.get_or("model", "tests/fixtures/hf/llava_layer_m2");
  const std::string dtype_s = a.get_or("dtype", "fp32");
  if (dtype_s != "fp32" && dtype_s != "bf16") throw std::invalid_argument("--dtype must be fp32 or bf16");
  const auto dtype = dtype_s == "bf16" ? at::kBFloat16 : at::kFloat;
  const int steps = std::stoi(a.get_or("steps", "3"));
  if (auto t = a.get("threads")) at::set_num_threads(std::stoi(*t));
  at::Device device(a.get_or("device", "cpu"));

  auto t0 = std::chrono::steady_clock::now();
  auto model = load_mod_pretrained(dir, dtype, device);  // dense or γ-MoD (config.json "mod")
  auto t_load = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ModelInputs in;
  const auto ref_path = (std::filesystem::path(dir) / "reference.safetensors").string();
  if (std::filesystem::exists(ref_path)) {
    SafetensorsFile ref(ref_path);
    in.input_ids = ref.tensor("input.input_ids").to(device);
    in.attention_mask = ref.tensor("input.attention_mask").to(at::kBool).to(device);
    in.labels = ref.tensor("input.labels").to(device);
    if (ref.has("input.pixel_values")) in.pixel_values = ref.tensor("input.pixel_values").to(device, dtype);
  } else {
    const int64_t B = std::stoi(a.get_or("batch", "2")), L = std::stoi(a.get_or("seq", "64"));
    auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
    in.input_ids = at::randint(3, model->config.text.vocab_size, {B, L}, gen, at::kLong).to(device);
    in.labels = in.input_ids.clone();
  }
  int64_t n_params = 0;
  for (auto& p : model->parameters()) n_params += p.numel();
  std::cout << "model " << dir << ": " << n_params << " parameters, " << dtype_s << ", loaded in " << t_load * 1e3
            << " ms\nbatch " << in.input_ids.size(0) << " x " << in.input_ids.size(1) << " tokens"
            << (in.pixel_values.defined() ? ", " + std::to_string(in.pixel_values.size(0)) + " images" : "") << "\n";
  for (int s = 0; s < steps; ++s) {
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    auto t1 = std::chrono::steady_clock::now();
    auto out = model->forward(in);
    auto t2 = std::chrono::steady_clock::now();
    out.lm_loss.backward();
    auto t3 = std::chrono::steady_clock::now();
    double gn = 0;
    for (auto& p : model->parameters())
      if (p.grad().defined()) gn += p.grad().to(at::kDouble).pow(2).sum().item<double>();
    std::printf("step %d  loss %.6f  grad-norm %.6f  forward %.2f ms  backward %.2f ms\n", s, out.lm_loss.item<double>(),
                std::sqrt(gn), std::chrono::duration<double, std::milli>(t2 - t1).count(),
                std::chrono::duration<double, std::milli>(t3 - t2).count());
  }
  return 0;
}

Register reg({"forward", "forward+backward of a checkpoint on a sample; prints loss and timing", run_forward});

}  // namespace
}  // namespace gmod::cli

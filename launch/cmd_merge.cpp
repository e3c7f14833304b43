// `gmod merge`: a Hugging Face model dir (dense or γ-MoD) plus a PEFT LoRA adapter dir (model/lora_peft.h) ->
// the merged Hugging Face dir, W' = W + alpha/r * B A on every adapted linear (PEFT's merge_and_unload), MoD
// routers and config kept. The result loads in gmod and, for a dense model, in transformers.
#include <torch/torch.h>

#include <filesystem>
#include <iostream>

#include "launch/args.h"
#include "launch/cli_hf_files.h"
#include "mod/conversion.h"
#include "mod/mod_checkpoint.h"
#include "model/lora_peft.h"

namespace gmod::cli {
namespace {

namespace fs = std::filesystem;

struct MergeOptions {
  std::string model, adapter, out, dtype = "fp32";
  std::string template_name;  // --template; empty: the base's chat template (else its family's)
};

int run_merge(const MergeOptions& o) {
  if (fs::weakly_canonical(o.model) == fs::weakly_canonical(o.out))
    throw UsageError("--out must differ from --model (the base is read while the merged model is written)");
  auto model = load_mod_pretrained(o.model, at::kFloat, at::kCPU);
  MoDConfig mc = read_mod_config(o.model).value_or(MoDConfig{});
  if (mod_layers(*model).empty()) mc.mod_layers.clear();
  const LoraAttachment att = load_peft_adapter(*model, o.adapter);
  const LoraConfig c = read_peft_adapter_config(o.adapter);
  const int merged = merge_lora(*model);
  model->to(at::kCPU, o.dtype == "bf16" ? at::kBFloat16 : at::kFloat);
  check_finite_weights(*model, "merged " + o.model + " + " + o.adapter, "written");
  save_mod_pretrained(*model, mc, o.out);
  write_hf_side_files(*model, {o.model}, o.out, o.template_name.empty() ? "auto" : o.template_name,
                      /*keep_source_template=*/o.template_name.empty());
  std::cout << "wrote " << o.out << ": " << merged << " linear layers merged (r " << c.r << ", alpha "
            << c.alpha << ", scale " << c.scale() << ", " << att.parameters << " adapter parameters), "
            << (mc.mod_layers.empty() ? "dense" : std::to_string(mc.mod_layers.size()) + " MoD layers kept")
            << ", " << o.dtype << "\n";
  return 0;
}

Runner setup_merge(CLI::App& app) {
  auto o = std::make_shared<MergeOptions>();
  add(app, "--model", o->model, "the base Hugging Face model dir (dense or γ-MoD)")
      ->type_name("DIR")
      ->required();
  add(app, "--adapter", o->adapter,
      "the PEFT LoRA adapter dir (adapter_config.json + adapter_model.safetensors or .bin)")
      ->type_name("DIR")
      ->required();
  add(app, "--out", o->out, "the merged Hugging Face model dir to write")->type_name("DIR")->required();
  add(app, "--dtype", o->dtype, "dtype of the written weights (the merge itself runs in fp32)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  add(app, "--template", o->template_name,
      "the chat template to write (a conversation template; default: the base's chat template, else its family's)");
  return [o] { return run_merge(*o); };
}

Register reg_merge({"merge", "a base model dir + a PEFT LoRA adapter -> the merged Hugging Face dir",
                    setup_merge});

}  // namespace
}  // namespace gmod::cli

// `gmod export`: a training checkpoint (or a Hugging Face dir, --from-hf) as a Hugging Face model directory
// (transformers' LlavaForConditionalGeneration / LlamaForCausalLM layout; γ-MoD routers and the "mod" config
// as mod/mod_checkpoint.h writes them). The architecture and MoD layers come from the run config stored in the
// checkpoint (trainer/model_setup.h), the weights from its model.h5. A LoRA run writes the base (frozen LLM, trained
// routers and projector) and its adapter in PEFT's format in <out>/adapter (model/lora_peft.h).
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "launch/args.h"
#include "launch/cli_hf_files.h"
#include "mod/conversion.h"
#include "mod/mod_checkpoint.h"
#include "mod/method_registry.h"
#include "mod/token_selection.h"
#include "model/lora_peft.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/model_setup.h"
#include "trainer/config/train_config.h"

namespace gmod::cli {
namespace {

namespace fs = std::filesystem;

const char* kExportFooter =
    "RUN_DIR picks its newest valid checkpoint; --out defaults to RUN_DIR/export/step-N.\n"
    "The run's model.path (or model.llm/vision) config.json must be readable from the current directory.\n"
    "--from-hf HF_DIR --out DIR re-saves a Hugging Face dir (e.g. official γ-MoD names -> transformers "
    "layout).";

struct ExportOptions {
  std::string checkpoint, out, from_hf;
  std::string template_name;  // --template; empty: the run's (checkpoint) or the source's chat template (--from-hf)
  // Per MoD method with an original checkpoint layout, whether its flag was given (mod/token_selection.h).
  std::map<const TokenSelector*, bool> original_layout;
};

void save_model(const MultimodalLM& m, const MoDConfig& mc, const std::string& out, const ExportOptions& o) {
  for (const auto& [method, on] : o.original_layout) {
    if (!on) continue;
    if (method->kind() != mc.router)
      throw UsageError(std::string(method->original_layout_flag()) + ": the model is not a " + method->display_name() +
                       " model (router " + to_string(mc.router) + ")");
    return method->save_original_layout(m, mc, out);
  }
  save_mod_pretrained(m, mc, out);
}

// Reloads `out` as gmod's loaders see it and checks every parameter is bit-identical to `m`'s.
size_t verify_export(const MultimodalLM& m, const std::string& out) {
  auto back = load_mod_pretrained(out, m.llm->embed_tokens.scalar_type());
  auto want = m.named_parameters(true), got = back->named_parameters(true);
  if (want.size() != got.size())
    throw std::runtime_error(out + ": reloaded model has " + std::to_string(got.size()) + " parameters, expected " +
                             std::to_string(want.size()));
  for (const auto& p : want) {
    const at::Tensor* q = got.find(p.key());
    if (!q || !at::equal(p.value(), *q))
      throw std::runtime_error(out + ": parameter " + p.key() + " does not read back identically");
  }
  return want.size();
}

void describe(const MultimodalLM& m, const MoDConfig& mc, const std::string& out, size_t verified) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  std::string layers;
  for (int l : mc.mod_layers) layers += (layers.empty() ? "" : ",") + std::to_string(l);
  std::string cls = m.vision ? "LlavaForConditionalGeneration" : "LlamaForCausalLM";
  std::ifstream cf(fs::path(out) / "config.json");  // what was written (a method's own type for its original layout)
  const auto cj = nlohmann::json::parse(cf, nullptr, /*allow_exceptions=*/false);
  if (cj.is_object() && cj.contains("architectures") && cj["architectures"].is_array() && !cj["architectures"].empty())
    cls = cj["architectures"][0].get<std::string>();
  const std::string kind = method_for(mc.router).display_name();
  std::cout << "wrote " << out << ": " << cls << ", " << n << " parameters, "
            << (mc.mod_layers.empty() ? std::string("dense")
                                      : kind + " layers [" + layers + "], router " + to_string(mc.router))
            << "; verified: " << verified << " tensors read back bit-identically\n";
}

int run_export(const ExportOptions& o) {
  if (!o.from_hf.empty()) {
    if (o.out.empty()) throw UsageError("--from-hf needs --out DIR");
    auto m = load_mod_pretrained(o.from_hf);
    MoDConfig mc = read_mod_config(o.from_hf).value_or(MoDConfig{});
    if (mod_layers(*m).empty()) mc.mod_layers.clear();
    check_finite_weights(*m, o.from_hf, "exported");
    save_model(*m, mc, o.out, o);
    write_hf_side_files(*m, {o.from_hf}, o.out, o.template_name.empty() ? "auto" : o.template_name,
                        /*keep_source_template=*/o.template_name.empty());
    describe(*m, mc, o.out, verify_export(*m, o.out));
    return 0;
  }
  if (o.checkpoint.empty()) throw UsageError("--checkpoint or --from-hf is required");
  std::string step_dir = o.checkpoint;
  if (!fs::exists(fs::path(step_dir) / "manifest.json")) {
    if (!fs::is_directory(fs::path(step_dir) / "checkpoints"))
      throw std::invalid_argument(step_dir + ": neither a checkpoint (no manifest.json) nor a run directory (no checkpoints/)");
    auto e = CheckpointManager(step_dir).find_latest_valid();
    if (!e) throw std::runtime_error(step_dir + "/checkpoints: no valid checkpoint");
    step_dir = e->path;
  } else {
    const std::string why = CheckpointManager::verify(step_dir);
    if (!why.empty()) throw std::runtime_error("checkpoint " + step_dir + " is not valid: " + why);
  }
  CheckpointReader reader(step_dir);
  reader.set_files_verified(true);  // every file's CRC was checked just above (find_latest_valid or verify)
  const TrainConfig cfg = train_config_from_json(reader.config(), {}, step_dir + "/trainer-state.json: config");
  const std::string src = describe_model_source(cfg.model);
  for (const std::string& dir : {cfg.model.path, cfg.model.llm, cfg.model.vision})
    if (!dir.empty() && !fs::exists(fs::path(dir) / "config.json"))
      throw std::runtime_error(step_dir + ": the run's model directory '" + dir +
                               "' has no config.json here (run gmod export from the directory the run was started in)");
  const fs::path run_dir = fs::path(step_dir).parent_path().parent_path();
  const std::string out = o.out.empty() ? (run_dir / "export" / fs::path(step_dir).filename()).string() : o.out;

  MoDConfig mc;
  auto model = build_run_model(cfg, &mc);
  NamedTensors params;
  for (auto& item : model->named_parameters()) params.emplace_back(item.key(), item.value());
  reader.load_model_into(params, /*strict=*/true);
  std::cout << "checkpoint " << step_dir << " (step " << reader.step() << ", model " << src << ", "
            << cfg.model.dtype << ")\n";
  check_finite_weights(*model, "checkpoint " + step_dir, "exported");
  if (cfg.lora.enabled()) {  // PEFT's adapter beside the base (the trained routers/projector are in the base)
    const std::string adapter = (fs::path(out) / "adapter").string();
    save_peft_adapter(*model, cfg.lora, adapter, out);
    std::cout << "wrote " << adapter << ": PEFT LoRA adapter (r " << cfg.lora.r << ", alpha " << cfg.lora.alpha
              << ", " << lora_modules(*model).size() << " linear layers); `gmod merge --model " << out
              << " --adapter " << adapter << " --out DIR` merges it\n";
    detach_lora(*model);
  }
  save_model(*model, mc, out, o);
  // The tokenizer the run trained with (data.tokenizer, else the model's), its processor files, the trained template.
  // From the vision tower's own directory (model.vision: a CLIP repository, which ships CLIP's text tokenizer too) only
  // its preprocessor config.
  std::vector<std::string> sources = {default_tokenizer_source(cfg.model)};
  if (!cfg.data.tokenizer.empty() && fs::is_directory(cfg.data.tokenizer)) sources.push_back(cfg.data.tokenizer);
  for (const std::string& s : sources)
    if (!s.empty() && fs::is_directory(s)) copy_processor_files(s, out);
  const fs::path pre = preprocessor_source(cfg.model).empty()
                           ? fs::path()
                           : fs::path(preprocessor_source(cfg.model)) / "preprocessor_config.json";
  if (!pre.empty() && fs::exists(pre))
    fs::copy_file(pre, fs::path(out) / "preprocessor_config.json", fs::copy_options::overwrite_existing);
  if (!cfg.data.tokenizer.empty() && fs::is_regular_file(cfg.data.tokenizer)) {
    const fs::path t(cfg.data.tokenizer);
    if (t.filename() == "tokenizer.model" || t.filename() == "tokenizer.json")
      fs::copy_file(t, fs::path(out) / t.filename(), fs::copy_options::overwrite_existing);
  }
  write_hf_side_files(*model, {}, out, o.template_name.empty() ? cfg.data.template_name : o.template_name,
                      /*keep_source_template=*/false);
  describe(*model, mc, out, verify_export(*model, out));
  return 0;
}

Runner setup_export(CLI::App& app) {
  auto o = std::make_shared<ExportOptions>();
  app.footer(kExportFooter);
  auto* ck = add(app, "--checkpoint", o->checkpoint, "a checkpoint (RUN_DIR/checkpoints/step-N) or a run dir")
                 ->type_name("DIR");
  add(app, "--out", o->out, "the Hugging Face dir to write (default: RUN_DIR/export/step-N)")->type_name("DIR");
  add(app, "--from-hf", o->from_hf, "re-save this Hugging Face dir instead of a checkpoint (needs --out)")
      ->type_name("DIR")
      ->excludes(ck);
  add(app, "--template", o->template_name,
      "the chat template to write (a conversation template; default: the run's, or for --from-hf the source's "
      "chat template, else its family's)");
  for (const TokenSelector* method : registered_methods())  // the methods' original layouts
    if (method->original_layout_flag())
      add_flag(app, method->original_layout_flag(), o->original_layout[method], method->original_layout_help());
  return [o] { return run_export(*o); };
}

Register reg_export({"export", "a training checkpoint as a Hugging Face model dir (dense or γ-MoD)",
                     setup_export});

}  // namespace
}  // namespace gmod::cli

// Helpers shared by the inference-side subcommands (arank, generate, eval): the model options
// (--model, --dtype, --device, --threads, --routing, and --random-init SEED and --mod RULE for demos and
// tests), the text options (--tokenizer, --template, --max-len) and the dataset options (--data, --images),
// declared once on CLI11 and loaded here. Header-only so the launch/ glob stays one file per subcommand.
#pragma once

#include <ATen/Parallel.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "data/image_prep.h"
#include "data/model_data.h"
#include "data/tokenizer.h"
#include "launch/args.h"
#include "mod/conversion.h"
#include "mod/method_registry.h"
#include "mod/mod_checkpoint.h"
#include "mod/mod_config.h"
#include "mod/token_selection.h"
#include "model/config.h"
#include "model/pretrained.h"
#include "model/tower_refs.h"

namespace gmod::cli {

// --model, --dtype, --device, --threads, --routing and, for demos and tests, --random-init and --mod.
struct ModelOptions {
  std::string model;
  std::string dtype = "fp32";
  std::string device = "cpu";
  int threads = 0;  // 0: LibTorch's default
  std::string routing;
  std::optional<uint64_t> random_init;
  std::string mod;
  // Per MoD method with a training-free inference flag, its value ("" unless given; mod/token_selection.h).
  std::map<const TokenSelector*, std::string> inference;
  TowerOverrides towers;
};

// --vision-tower, --vision-tower-slow, --vision-tower-aux: where the towers an original config names are
// (model/tower_refs.h); the runner passes them to set_tower_overrides before loading.
inline void add_tower_options(CLI::App& app, TowerOverrides& t) {
  const char* g = "Vision towers named by an original LLaVA / LLaVA-HR / MGM / γ-MoD config";
  add(app, "--vision-tower", t.vision,
      "the CLIP tower's directory (config.json), instead of looking up mm_vision_tower (model dir, path, "
      "Hugging Face cache, known architectures)")
      ->type_name("DIR")
      ->group(g);
  add(app, "--vision-tower-slow", t.vision_slow, "LLaVA-HR's ConvNeXt: a timm name or a directory")
      ->type_name("NAME|DIR")
      ->group(g);
  add(app, "--vision-tower-aux", t.vision_aux, "Mini-Gemini's auxiliary ConvNeXt: a directory (its name decides)")
      ->type_name("DIR")
      ->group(g);
}

inline void add_model_options(CLI::App& app, ModelOptions& o) {
  add(app, "--model", o.model, "Hugging Face model dir (dense, or γ-MoD with \"mod\" in config.json)")
      ->type_name("DIR")
      ->required();
  add(app, "--dtype", o.dtype, "weights and compute dtype")->check(CLI::IsMember({"fp32", "bf16"}));
  add(app, "--device", o.device, "cpu, cuda or cuda:N")->check(torch_device());
  add(app, "--threads", o.threads, "CPU threads (0: LibTorch's default)")->check(thread_count());
  add(app, "--routing", o.routing,
      "MoD layers' full-sequence routing: auto (thresholds in eval, as γ-MoD inference), topk (the training "
      "capacity) or threshold; default: the model's")
      ->check(CLI::IsMember({"auto", "topk", "threshold"}));
  for (const TokenSelector* method : registered_methods())  // the methods' training-free conversions
    if (const auto f = method->inference_flag(); f.flag)
      add(app, f.flag, o.inference[method], f.help)->type_name(f.type_name);
  const char* g = "Options for demos and tests";
  add(app, "--random-init", o.random_init,
      "build the model from DIR/config.json with random weights of this seed")
      ->type_name("SEED")
      ->group(g);
  add(app, "--mod", o.mod,
      "convert to γ-MoD by this rule (e.g. layers:2,3 or arank_mod), fresh shared router")
      ->type_name("RULE")
      ->group(g);
  add_tower_options(app, o.towers);
}

// --tokenizer, --template, --max-len: how records become tokens.
struct TextOptions {
  std::string tokenizer;  // empty: the model dir
  std::string template_name = "auto";
  std::optional<int> max_len;  // empty: the model's max_position_embeddings
};

inline void add_text_options(CLI::App& app, TextOptions& o, bool with_max_len = true) {
  add(app, "--tokenizer", o.tokenizer,
      "tokenizer.model / tokenizer.json or a dir holding one (default: --model)")
      ->type_name("PATH");
  // Checked by data/conversation.cpp, which owns the list of templates.
  add(app, "--template", o.template_name,
      "conversation template: vicuna_v1, plain, chatml, qwen2_5, qwen3_vl, llama3, llama3_1, mistral or auto "
      "(the "
      "model family's: LLaMA-2 vicuna_v1, LLaMA-3 llama3/llama3_1, Qwen2 chatml, Qwen3-VL qwen3_vl, Mistral "
      "mistral)");
  if (with_max_len)
    add(app, "--max-len", o.max_len, "tokens per sample after truncation (default: the model's context)")
        ->check(positive());
}

// --data, --images: a LLaVA-format dataset.
struct DataOptions {
  std::string data;
  std::string images;  // empty: the data file's folder
};

inline void add_data_options(CLI::App& app, DataOptions& o) {
  add(app, "--data", o.data, "LLaVA-format records (.json or .jsonl)")->type_name("JSON")->required();
  add(app, "--images", o.images, "image folder (default: the data file's folder)")->type_name("DIR");
}

struct CliModel {
  std::shared_ptr<MultimodalLM> model;
  std::string dir;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  std::vector<int> mod_layers;  // empty: dense
};

// --model DIR (a Hugging Face model dir, dense or γ-MoD), --dtype fp32|bf16, --device cpu|cuda[:i].
// For demos and tests (their own group in --help): --random-init SEED builds the model from DIR/config.json
// with init_weights instead of loading weights; --mod RULE (a conversion rule, e.g. "layers:2,3" or
// "arank_mod") converts the model to γ-MoD with a freshly initialised shared router.
// --routing auto|topk|threshold: the MoD layers' full-sequence routing rule (auto = thresholds in eval mode,
// as γ-MoD inference; topk = the training capacity, skip_frac of the routable tokens).
inline CliModel load_cli_model(const ModelOptions& o) {
  CliModel m;
  m.dir = o.model;
  m.dtype = o.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  m.device = at::Device(o.device);
  if (o.threads > 0) at::set_num_threads(o.threads);
  set_tower_overrides(o.towers);
  if (o.random_init) {
    m.model = std::make_shared<MultimodalLM>(load_model_config(m.dir));
    m.model->init_weights(*o.random_init);
    // A γ-MoD dir's "mod" object (validated: unknown keys are errors) makes the random model γ-MoD too, with
    // a fresh router; a dense model here would silently not be the model the dir describes.
    if (const auto mc = read_mod_config(m.dir); mc && !mc->mod_layers.empty() && o.mod.empty()) {
      validate(*mc, m.model->config.text.num_hidden_layers, m.dir + "/config.json: \"mod\"");
      convert_to_mod(*m.model, *mc);
    }
  } else {
    m.model = load_mod_pretrained(m.dir, m.dtype, at::kCPU);  // dense, or γ-MoD with config.json "mod"
  }
  if (!o.mod.empty()) {
    MoDConfig mc;
    const int n = m.model->config.text.num_hidden_layers;
    ConversionRule rule;
    try {
      rule = parse_conversion_rule(o.mod);
    } catch (const std::exception& e) {
      throw UsageError(std::string("--mod: ") + e.what());
    }
    mc.mod_layers = select_mod_layers(rule, n);
    mc.selection = o.mod;
    validate(mc, n, "--mod");
    convert_to_mod(*m.model, mc);
  }
  std::vector<std::pair<const TokenSelector*, std::string>> given;  // inference flags given
  for (const auto& [method, spec] : o.inference)
    if (!spec.empty()) given.emplace_back(method, spec);
  if (given.size() > 1) {
    std::string names;
    for (const auto& g : given) names += (names.empty() ? "" : " and ") + std::string(g.first->inference_flag().flag);
    throw UsageError(names + ": choose one");
  }
  if (!given.empty()) {
    const std::string opt = given[0].first->inference_flag().flag, spec = given[0].second;
    if (!mod_layers(*m.model).empty())
      throw UsageError(opt + " " + spec + ": the model at " + m.dir + " already has MoD layers (" + opt +
                       " needs a dense one)");
    MoDConfig mc;
    try {
      mc = given[0].first->config_from_spec(spec, m.model->config.text.num_hidden_layers);
    } catch (const std::exception& e) {
      throw UsageError(opt + ": " + e.what());
    }
    convert_to_mod(*m.model, mc);
  }
  if (const auto layers = mod_layers(*m.model); !layers.empty())
    m.mod_layers = layers.front()->cfg.mod_layers;
  if (!o.routing.empty()) {
    if (m.mod_layers.empty())
      throw UsageError("--routing " + o.routing + ": the model at " + m.dir + " has no MoD layer");
    if (o.routing == "auto")
      set_routing_mode(*m.model, RoutingMode::kAuto);
    else if (o.routing == "topk")
      set_routing_mode(*m.model, RoutingMode::kTopK);
    else
      set_routing_mode(*m.model, RoutingMode::kThreshold);
  }
  m.model->to(m.device, m.dtype);
  m.model->eval();
  return m;
}

inline std::shared_ptr<const Tokenizer> load_cli_tokenizer(const TextOptions& t, const CliModel& m) {
  std::shared_ptr<const Tokenizer> tok = load_tokenizer(t.tokenizer.empty() ? m.dir : t.tokenizer);
  if (tok->vocab_size() > m.model->config.text.vocab_size)
    throw std::invalid_argument("--tokenizer: vocabulary of " + std::to_string(tok->vocab_size()) +
                                " ids does not fit the model's vocab_size " +
                                std::to_string(m.model->config.text.vocab_size));
  return tok;
}

// Conversation and image settings that follow the model (image tokens, crop size, preprocessor_config.json) and
// the image preparer the model takes (fixed-size crops or native-resolution patches, data/image_prep.h), decided as
// the trainer decides it (trainer/trainer.cpp setup_data); `tok` gives the vision start / end tokens.
inline DatasetConfig cli_dataset_config(const TextOptions& t, const CliModel& m,
                                        const std::shared_ptr<const Tokenizer>& tok) {
  DatasetConfig dc;
  dc.conversation.template_name = resolve_conversation_template(t.template_name, m.model->config.text);
  // Default: the model's context (LLaVA-1.5 trains at 2048).
  const int positions = m.model->config.text.max_position_embeddings;
  if (t.max_len && *t.max_len > positions)
    throw UsageError("--max-len " + std::to_string(*t.max_len) +
                     " is beyond the model's max_position_embeddings (" + std::to_string(positions) + ", " +
                     m.dir + ")");
  dc.sample.max_len = t.max_len.value_or(positions);
  // The image token, preprocessing and the image / video preparers, as `gmod train` decides them.
  configure_for_model(dc, m.model->config, m.dir, tok);
  return dc;
}

// --data JSON --images DIR (default: the data file's folder).
inline std::unique_ptr<Dataset> make_cli_dataset(const DataOptions& d, const TextOptions& t,
                                                 const CliModel& m, std::shared_ptr<const Tokenizer> tok) {
  DatasetConfig dc = cli_dataset_config(t, m, tok);
  dc.data_path = d.data;
  dc.image_folder = d.images.empty() ? std::filesystem::path(d.data).parent_path().string() : d.images;
  return std::make_unique<Dataset>(dc, std::move(tok));
}

inline int crop_size(const Dataset& ds) { return ds.config().image.crop; }

}  // namespace gmod::cli

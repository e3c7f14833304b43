// Helpers shared by the inference-side subcommands (arank, generate, eval): the model options
// (--model, --dtype, --device, the hidden --random-init SEED and --mod RULE used by demos and tests)
// and the dataset options (--data, --images, --tokenizer, --template, --max-len). Header-only so the
// launch/ glob stays one file per subcommand.
#pragma once

#include <ATen/Parallel.h>

#include <filesystem>
#include <initializer_list>
#include <iostream>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>

#include "data/dataset.h"
#include "data/tokenizer.h"
#include "launch/args.h"
#include "model/config.h"
#include "model/pretrained.h"
#include "mod/conversion.h"
#include "mod/mod_config.h"
#include "mod/mod_checkpoint.h"

namespace gmod::cli {

// Options read by load_cli_model.
inline const std::set<std::string> kModelOptions = {"model", "dtype", "device", "random-init", "mod", "routing", "threads"};
// Options read by make_cli_dataset.
inline const std::set<std::string> kDataOptions = {"data", "images", "tokenizer", "template", "max-len"};

inline std::set<std::string> known_options(std::initializer_list<std::set<std::string>> groups) {
  std::set<std::string> out;
  for (const auto& g : groups) out.insert(g.begin(), g.end());
  return out;
}

struct CliModel {
  std::shared_ptr<MultimodalLM> model;
  std::string dir;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  std::vector<int> mod_layers;  // empty: dense
};

// --model DIR (a Hugging Face model dir, dense or γ-MoD), --dtype fp32|bf16, --device cpu|cuda[:i].
// Hidden, for demos and tests: --random-init SEED builds the model from DIR/config.json with init_weights
// instead of loading weights; --mod RULE (a conversion rule, e.g. "layers:2,3" or "arank_mod") converts the
// model to γ-MoD with a freshly initialised shared router.
// --routing auto|topk|threshold: the MoD layers' full-sequence routing rule (auto = thresholds in eval mode, as
// γ-MoD inference; topk = the training capacity, skip_frac of the routable tokens).
inline CliModel load_cli_model(const Args& a) {
  CliModel m;
  auto dir = a.get("model");
  if (!dir) throw std::invalid_argument("--model DIR is required");
  m.dir = *dir;
  const std::string dtype_s = a.get_or("dtype", "fp32");
  if (dtype_s != "fp32" && dtype_s != "bf16") throw std::invalid_argument("--dtype must be fp32 or bf16");
  m.dtype = dtype_s == "bf16" ? at::kBFloat16 : at::kFloat;
  m.device = at::Device(a.get_or("device", "cpu"));
  if (auto t = a.get("threads")) at::set_num_threads(std::stoi(*t));
  if (auto seed = a.get("random-init")) {
    m.model = std::make_shared<MultimodalLM>(load_model_config(m.dir));
    m.model->init_weights(std::stoull(*seed));
  } else {
    m.model = load_mod_pretrained(m.dir, m.dtype, at::kCPU);  // dense, or γ-MoD with config.json "mod"
  }
  if (auto rule = a.get("mod")) {
    MoDConfig mc;
    const int n = m.model->config.text.num_hidden_layers;
    mc.mod_layers = select_mod_layers(parse_conversion_rule(*rule), n);
    mc.selection = *rule;
    validate(mc, n, "--mod");
    convert_to_mod(*m.model, mc);
  }
  if (const auto layers = mod_layers(*m.model); !layers.empty()) m.mod_layers = layers.front()->cfg.mod_layers;
  if (auto r = a.get("routing")) {
    if (m.mod_layers.empty()) throw std::invalid_argument("--routing: the model has no MoD layer");
    if (*r == "auto") set_routing_mode(*m.model, RoutingMode::kAuto);
    else if (*r == "topk") set_routing_mode(*m.model, RoutingMode::kTopK);
    else if (*r == "threshold") set_routing_mode(*m.model, RoutingMode::kThreshold);
    else throw std::invalid_argument("--routing must be auto, topk or threshold, not " + *r);
  }
  m.model->to(m.device, m.dtype);
  m.model->eval();
  return m;
}

inline std::shared_ptr<const Tokenizer> load_cli_tokenizer(const Args& a, const CliModel& m) {
  std::shared_ptr<const Tokenizer> tok = load_tokenizer(a.get_or("tokenizer", m.dir));
  if (tok->vocab_size() > m.model->config.text.vocab_size)
    throw std::invalid_argument("--tokenizer: vocabulary of " + std::to_string(tok->vocab_size()) +
                                " ids does not fit the model's vocab_size " +
                                std::to_string(m.model->config.text.vocab_size));
  return tok;
}

// Conversation and image settings that follow the model (image tokens, crop size, preprocessor_config.json).
inline DatasetConfig cli_dataset_config(const Args& a, const CliModel& m) {
  DatasetConfig dc;
  dc.conversation.template_name = a.get_or("template", "vicuna_v1");
  dc.conversation.image_token_id = m.model->config.image_token_id;
  dc.conversation.image_seq_length = m.model->config.vision ? m.model->config.image_seq_length() : 0;
  // Default: the model's context (LLaVA-1.5 trains at 2048).
  dc.sample.max_len = std::stoi(a.get_or("max-len", std::to_string(m.model->config.text.max_position_embeddings)));
  const auto pre = std::filesystem::path(m.dir) / "preprocessor_config.json";
  if (std::filesystem::exists(pre)) dc.image = load_preprocess_config(pre.string());
  else if (m.model->config.vision) dc.image.size = dc.image.crop = m.model->config.vision->image_size;
  return dc;
}

// --data JSON --images DIR (default: the data file's folder).
inline std::unique_ptr<Dataset> make_cli_dataset(const Args& a, const CliModel& m,
                                                 std::shared_ptr<const Tokenizer> tok) {
  auto data = a.get("data");
  if (!data) throw std::invalid_argument("--data JSON is required");
  DatasetConfig dc = cli_dataset_config(a, m);
  dc.data_path = *data;
  dc.image_folder = a.get_or("images", std::filesystem::path(*data).parent_path().string());
  return std::make_unique<Dataset>(dc, std::move(tok));
}

inline int crop_size(const Dataset& ds) { return ds.config().image.crop; }

}  // namespace gmod::cli

// `gmod generate`: one prompt (optionally with images) through a dense or γ-MoD model, greedy or top-p
// sampling; prints the generated text and, for MoD models, the skip ratio of the generation.
#include <torch/torch.h>

#include <cstring>
#include <iostream>

#include "data/clip_preprocess.h"
#include "data/conversation.h"
#include "data/image.h"
#include "launch/cli_model.h"
#include "mod/accounting.h"
#include "mod/generate.h"

namespace gmod::cli {
namespace {

const char* kUsage =
    "usage: gmod generate --model DIR [--tokenizer T] [--image PNG|JPG ...] --prompt TEXT [--template vicuna_v1]\n"
    "                     [--max-new-tokens 64] [--top-p P --temperature T --seed S]  (greedy by default)\n"
    "                     [--system TEXT] [--dtype fp32|bf16] [--device D]\n";

struct Prompt {
  std::vector<int32_t> ids;
  std::vector<TokenRole> roles;
};

// The template's tokens of a one-turn conversation up to where the assistant's answer starts: the record is
// encoded with a placeholder answer and cut at its first supervised token, so the prefix is exactly what the
// training template produces (BOS, system prompt, image tokens, " USER: ... ASSISTANT:").
Prompt build_prompt(const ConversationEncoder& enc, std::string text, size_t n_images) {
  size_t placeholders = 0;
  for (size_t p = text.find("<image>"); p != std::string::npos; p = text.find("<image>", p + 1)) ++placeholders;
  if (placeholders == 0)
    for (size_t i = 0; i < n_images; ++i) text = "<image>\n" + text;
  else if (placeholders != n_images)
    throw std::invalid_argument("--prompt has " + std::to_string(placeholders) + " <image> placeholders but " +
                                std::to_string(n_images) + " --image were given");
  Record r;
  r.id = "prompt";
  r.images.assign(n_images, "image");
  r.conversations = {{"human", text}, {"gpt", "x"}};
  const EncodedConversation e = enc.encode(r, "--prompt");
  size_t start = 0;
  while (start < e.labels.size() && e.labels[start] == kIgnoreIndex) ++start;
  Prompt p;
  p.ids.assign(e.ids.begin(), e.ids.begin() + start);
  p.roles.assign(e.roles.begin(), e.roles.begin() + start);
  return p;
}

int run_generate(const std::vector<std::string>& argv) {
  if (argv.empty()) {
    std::cerr << kUsage;
    return 2;
  }
  Args a(argv);
  a.check_known(known_options({kModelOptions,
                               {"tokenizer", "template", "image", "prompt", "max-new-tokens", "top-p", "temperature",
                                "seed", "system"}}));
  auto text = a.get("prompt");
  if (!text) throw std::invalid_argument("--prompt TEXT is required");
  CliModel m = load_cli_model(a);
  auto tok = load_cli_tokenizer(a, m);
  DatasetConfig dc = cli_dataset_config(a, m);
  if (auto s = a.get("system")) dc.conversation.system_prompt = *s;
  ConversationEncoder enc(tok, dc.conversation);
  const std::vector<std::string> images = a.all("image");
  if (!images.empty() && !m.model->config.vision)
    throw std::invalid_argument("--image: the model at " + m.dir + " has no vision tower");
  const Prompt p = build_prompt(enc, *text, images.size());

  ModelInputs in;
  const int64_t L = static_cast<int64_t>(p.ids.size());
  std::vector<int64_t> ids64(p.ids.begin(), p.ids.end());
  std::vector<int8_t> roles8;
  for (TokenRole r : p.roles) roles8.push_back(static_cast<int8_t>(r));
  in.input_ids = at::from_blob(ids64.data(), {1, L}, at::kLong).clone();        // [1, L]
  in.token_roles = at::from_blob(roles8.data(), {1, L}, at::kChar).clone();     // [1, L]
  if (!images.empty()) {
    const int S = dc.image.crop;
    in.pixel_values = at::empty({int64_t(images.size()), 3, S, S}, at::kFloat);
    for (size_t i = 0; i < images.size(); ++i) {
      std::vector<float> px = clip_preprocess(decode_image_file(images[i]), dc.image);
      std::memcpy(in.pixel_values[int64_t(i)].data_ptr<float>(), px.data(), px.size() * sizeof(float));
    }
    in.pixel_values = in.pixel_values.to(m.device, m.dtype);
  }
  in.input_ids = in.input_ids.to(m.device);
  in.token_roles = in.token_roles.to(m.device);

  GenerateOptions g;
  g.max_new_tokens = std::stoll(a.get_or("max-new-tokens", "64"));
  if (a.get("top-p") || a.get("temperature")) {
    g.greedy = false;
    g.top_p = std::stod(a.get_or("top-p", "1.0"));
    g.temperature = std::stod(a.get_or("temperature", "1.0"));
  }
  g.seed = std::stoull(a.get_or("seed", "0"));
  if (auto eos = tok->eos_id()) g.eos_token_id = *eos;
  g.pad_token_id = enc.pad_id();
  const GenerateResult r = generate(*m.model, in, g);

  const at::Tensor out = r.tokens.cpu()[0];
  const int64_t n = r.lengths.cpu()[0].item<int64_t>();
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = static_cast<int32_t>(out[i].item<int64_t>());
    if (g.eos_token_id >= 0 && id == g.eos_token_id) break;
    ids.push_back(id);
  }
  std::cout << "prompt: " << L << " tokens" << (images.empty() ? "" : ", " + std::to_string(images.size()) + " images")
            << "; generated " << n << " tokens (" << (g.greedy ? "greedy" : "top-p sampling") << ")\n";
  std::cout << "output: " << tok->decode(ids) << "\n";
  const ComputeReport rep = account_compute(r.layer_tokens, m.model->config.text, {});
  if (rep.mod_total > 0) {
    std::printf("skip ratio: MoD layers %.4f, all layers %.4f\n", rep.mod_skip_ratio(), rep.skip_ratio());
    for (const auto& l : rep.layers)
      if (l.mod) std::printf("  layer %d skip %.4f (%lld/%lld processed)\n", l.layer, l.skip_ratio(),
                             static_cast<long long>(l.processed), static_cast<long long>(l.total));
  }
  return 0;
}

Register reg({"generate", "generate text for a prompt (and images) with a dense or γ-MoD model", run_generate});

}  // namespace
}  // namespace gmod::cli

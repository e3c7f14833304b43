// `gmod generate`: one prompt (optionally with images) through a dense or γ-MoD model, greedy or top-p
// sampling; prints the generated text and, for MoD models, the skip ratio of the generation.
#include <torch/torch.h>

#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>

#include "data/conversation.h"
#include "data/image.h"
#include "launch/cli_model.h"
#include "launch/cli_prompt.h"
#include "launch/cli_sampling.h"
#include "mod/accounting.h"
#include "mod/generate.h"

namespace gmod::cli {
namespace {

struct GenerateCliOptions {
  ModelOptions model;
  TextOptions text;
  std::vector<std::string> images;
  std::string prompt;
  std::string system;
  int64_t max_new_tokens = 64;
  std::optional<double> top_p, temperature;
  uint64_t seed = 0;
  bool print_ids = false;
  std::string pixel_values;  // the --image files' pixels as another preprocessor made them (raw float32)
};

std::string id_list(const std::vector<int64_t>& ids) {
  std::string s;
  for (int64_t id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}

// Fills `out` ([N, 3, S, S] float32) from a file of exactly that many raw float32 values (native byte order,
// as numpy's tofile writes them): another preprocessor's pixels, so a model can be compared on identical
// inputs.
void read_pixel_values(const std::string& path, at::Tensor& out) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw UsageError("--pixel-values " + path + ": cannot open");
  const int64_t want = out.numel() * int64_t(sizeof(float)), got = int64_t(f.tellg());
  if (got != want)
    throw UsageError("--pixel-values " + path + ": " + std::to_string(got) + " bytes, expected " +
                     std::to_string(want) + " (float32 [" + std::to_string(out.size(0)) + ", 3, " +
                     std::to_string(out.size(2)) + ", " + std::to_string(out.size(3)) +
                     "]: one image per --image at the model's input size)");
  f.seekg(0);
  f.read(reinterpret_cast<char*>(out.data_ptr<float>()), want);
  if (!f) throw UsageError("--pixel-values " + path + ": read failed");
  if (!at::isfinite(out).all().item<bool>())
    throw UsageError("--pixel-values " + path + ": non-finite values");
}

int run_generate(const GenerateCliOptions& o) {
  CliModel m = load_cli_model(o.model);
  auto tok = load_cli_tokenizer(o.text, m);
  DatasetConfig dc = cli_dataset_config(o.text, m, tok);
  if (!o.system.empty()) dc.conversation.system_prompt = o.system;
  ConversationEncoder enc(tok, dc.conversation);
  const std::vector<std::string>& images = o.images;
  if (!o.pixel_values.empty() && images.empty())
    throw UsageError(
        "--pixel-values needs the --image files it stands for (their count places the image tokens)");
  if (!images.empty() && !m.model->vision)
    throw UsageError("--image: the model at " + m.dir + " has no vision tower");
  // The images through the model's preparer (fixed-size crops, or native-resolution patches whose token counts
  // follow each image's size); --pixel-values stands for crops only.
  const ImagePreparer& prep = *dc.image_preparer;
  if (!o.pixel_values.empty() && prep.size_dependent())
    throw UsageError("--pixel-values: the model at " + m.dir + " takes native-resolution images (" + prep.describe() +
                     "), not fixed-size crops");
  std::vector<Image> decoded;
  if (o.pixel_values.empty())
    for (const std::string& f : images) decoded.push_back(decode_image_file(f));
  PromptImages pi = o.pixel_values.empty() ? prepare_prompt_images(prep, decoded, dc.image.crop) : PromptImages{};
  const Prompt p = build_prompt(enc, o.prompt, images.size(), "--prompt", pi.spans);
  const int positions = m.model->config.text.max_position_embeddings;
  if (int64_t(p.ids.size()) + o.max_new_tokens > positions)
    throw UsageError(
        "--max-new-tokens " + std::to_string(o.max_new_tokens) + ": the prompt (" +
        std::to_string(p.ids.size()) + " positions with its image tokens) plus the answer would be " +
        "beyond the model's max_position_embeddings (" + std::to_string(positions) + ", " + m.dir + ")");

  ModelInputs in;
  const int64_t L = static_cast<int64_t>(p.ids.size());
  std::vector<int64_t> ids64(p.ids.begin(), p.ids.end());
  std::vector<int8_t> roles8;
  for (TokenRole r : p.roles) roles8.push_back(static_cast<int8_t>(r));
  in.input_ids = at::from_blob(ids64.data(), {1, L}, at::kLong).clone();        // [1, L]
  in.token_roles = at::from_blob(roles8.data(), {1, L}, at::kChar).clone();     // [1, L]
  if (!images.empty()) {
    const int S = dc.image.crop;
    if (!o.pixel_values.empty()) {
      in.pixel_values = at::empty({int64_t(images.size()), 3, S, S}, at::kFloat);
      read_pixel_values(o.pixel_values, in.pixel_values);
    } else {
      in.pixel_values = pi.pixel_values;
      if (pi.image_grid_thw.defined()) in.image_grid_thw = pi.image_grid_thw.to(m.device);
      if (pi.image_sizes.defined()) in.image_sizes = pi.image_sizes;  // AnyRes: read on the host to pack
    }
    in.pixel_values = in.pixel_values.to(m.device, m.dtype);
  }
  in.input_ids = in.input_ids.to(m.device);
  in.token_roles = in.token_roles.to(m.device);

  const GenerateOptions g = cli::sampling_options(o, enc.end_of_turn_id(), enc.pad_id());
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
  if (o.print_ids) {  // what another implementation is compared with (tests/launch/check_hf_export.py)
    std::cout << "prompt ids: " << id_list(ids64) << "\n";
    std::cout << "output ids: " << id_list(std::vector<int64_t>(ids.begin(), ids.end())) << "\n";
  }
  const ComputeReport& rep = r.compute;
  if (rep.mod_total > 0) {
    std::printf("skip ratio: MoD layers %.4f, all layers %.4f\n", rep.mod_skip_ratio(), rep.skip_ratio());
    std::printf("FLOPs vs the same generation without MoD: %.4f (%.4g / %.4g GFLOP; decoder %.4f)\n", rep.flop_ratio(),
                rep.flops * 1e-9, rep.dense_flops * 1e-9, rep.decoder_flop_ratio());
    for (const auto& l : rep.layers)
      if (l.mod) std::printf("  layer %d skip %.4f (%lld/%lld processed)\n", l.layer, l.skip_ratio(),
                             static_cast<long long>(l.processed), static_cast<long long>(l.total));
  }
  return 0;
}

Runner setup_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateCliOptions>();
  add_model_options(app, o->model);
  add_text_options(app, o->text, /*with_max_len=*/false);
  add(app, "--prompt", o->prompt, "the user's turn; <image> marks where each image goes (default: before the text)")
      ->required();
  add(app, "--image", o->images, "an image (PNG or JPEG); repeat for several")->type_name("FILE");
  add(app, "--system", o->system, "system prompt (default: the template's)");
  add(app, "--max-new-tokens", o->max_new_tokens, "tokens to generate at most")->check(positive());
  add(app, "--top-p", o->top_p, "top-p sampling with this p (default: greedy)")->type_name("P")->check(between(0.0, 1.0));
  add(app, "--temperature", o->temperature, "sampling temperature (implies sampling; default 1.0 then)")
      ->type_name("T")
      ->check(positive());
  add(app, "--seed", o->seed, "sampling seed");
  add_flag(app, "--print-ids", o->print_ids,
           "also print the prompt's token ids (image tokens expanded) and the generated ids (up to the stop token)");
  add(app, "--pixel-values", o->pixel_values,
      "the --image files' pixels as another preprocessor made them, instead of gmod's preprocessing: raw "
      "float32 "
      "[N, 3, S, S] (N images, S the model's input size; numpy's tofile)")
      ->type_name("FILE");
  return [o] { return run_generate(*o); };
}

Register reg_generate({"generate", "generate text for a prompt (and images) with a dense or γ-MoD model",
                       setup_generate});

}  // namespace
}  // namespace gmod::cli

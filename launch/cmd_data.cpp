// `gmod data check DATA --tokenizer T ...`: validate a dataset before a long job (data/check.h).
// `gmod data demo --out DIR [--train N] [--heldout N] [--image-size S] [--seed S]`: write the shapes demo
// set.
// `gmod data chat-template --template T [--system S] [--no-image-first]`: print the Hugging Face chat template (Jinja)
// gmod export writes for a conversation template (data/chat_template.h).
#include <iostream>
#include <memory>

#include "data/chat_template.h"
#include "data/check.h"
#include "data/demo_dataset.h"
#include "launch/args.h"

namespace gmod::cli {
namespace {

struct DataCliOptions {
  DataCheckOptions check;
  bool no_image_first = false, no_decode = false;
  std::string out;
  DemoDatasetOptions demo;
  std::string chat_template = "vicuna_v1", system;
  bool chat_no_image_first = false, chat_for_processor = false;
};

int run_chat_template(const DataCliOptions& o) {
  if (o.chat_template == "auto" || !is_conversation_template(o.chat_template))
    throw UsageError("--template " + o.chat_template + ": expected one of " + conversation_template_list() +
                     " (without auto)");
  ConversationConfig c;
  c.template_name = o.chat_template;
  if (!o.system.empty()) c.system_prompt = o.system;
  c.image_first = !o.chat_no_image_first;
  std::cout << hf_chat_template(c, /*bos_first=*/!o.chat_for_processor) << "\n";
  return 0;
}

// run_data_check stays the one implementation of the check and its report (and exit codes: 1 when records
// have problems, 2 when the dataset cannot be read); it gets the options CLI11 parsed as canonical arguments.
int run_check(const DataCliOptions& o) {
  const DataCheckOptions& c = o.check;
  std::vector<std::string> args = {c.data,
                                   "--tokenizer",
                                   c.tokenizer,
                                   "--template",
                                   c.template_name,
                                   "--max-len",
                                   std::to_string(c.max_len),
                                   "--image-tokens",
                                   std::to_string(c.image_tokens),
                                   "--image-token-id",
                                   std::to_string(c.image_token_id),
                                   "--truncation",
                                   c.truncation,
                                   "--workers",
                                   std::to_string(c.workers),
                                   "--max-image-pixels",
                                   std::to_string(c.max_image_pixels)};
  if (!c.images.empty()) args.insert(args.end(), {"--images", c.images});
  if (o.no_image_first) args.push_back("--no-image-first");
  if (o.no_decode) args.push_back("--no-decode");
  return run_data_check(args, std::cout, std::cerr);
}

int run_demo(const DataCliOptions& o) {
  make_demo_dataset(o.out, o.demo);
  std::cout << "wrote " << o.demo.num_train << " train and " << o.demo.num_heldout << " held-out records to "
            << o.out << "\n";
  return 0;
}

Runner setup_data(CLI::App& app) {
  auto o = std::make_shared<DataCliOptions>();
  app.require_subcommand(1);
  CLI::App* check =
      app.add_subcommand("check", "validate every record as training would use it; report each problem");
  check->footer("Exit code 1 when records have problems or there is no record, 2 on a usage error or an unreadable "
                "dataset.");
  DataCheckOptions& c = o->check;
  add(*check, "data", c.data, "LLaVA-format records (.json or .jsonl)")->type_name("DATA")->required();
  add(*check, "--images", c.images, "image folder")->type_name("DIR");
  add(*check, "--tokenizer", c.tokenizer, "tokenizer.model / tokenizer.json or a dir holding one")
      ->type_name("PATH")
      ->required();
  add(*check, "--template", c.template_name,
      "conversation template: vicuna_v1, plain, chatml, qwen2_5, qwen3_vl, llama3, llama3_1 or mistral");
  add(*check, "--max-len", c.max_len, "tokens per sample after truncation")->check(positive());
  add(*check, "--image-tokens", c.image_tokens, "tokens each image expands to")->check(non_negative());
  add(*check, "--image-token-id", c.image_token_id, "id of the image placeholder token")
      ->check(non_negative());
  add(*check, "--truncation", c.truncation, "over-long records: turn (cut whole turns) or skip")
      ->check(CLI::IsMember({"turn", "skip"}));
  add(*check, "--workers", c.workers, "threads preparing records")->check(between(1, 256));
  add_flag(*check, "--no-image-first", o->no_image_first, "keep <image> where the text puts it");
  add_flag(*check, "--no-decode", o->no_decode,
           "only read image headers (readable, JPEG/PNG, within --max-image-pixels), do not decode (faster)");
  add(*check, "--max-image-pixels", c.max_image_pixels,
      "decoded-pixel limit per image (width x height), checked from the header before decoding")
      ->check(positive());

  CLI::App* demo =
      app.add_subcommand("demo", "write the generated shapes dataset (train.json, heldout.json, images/)");
  add(*demo, "--out", o->out, "folder to write")->type_name("DIR")->required();
  add(*demo, "--train", o->demo.num_train, "training records")->check(non_negative());
  add(*demo, "--heldout", o->demo.num_heldout, "held-out records")->check(non_negative());
  add(*demo, "--image-size", o->demo.image_size, "square image side, pixels (>= 32)")
      ->check(between(32, 1 << 16));
  add(*demo, "--seed", o->demo.seed, "random seed");

  CLI::App* chat = app.add_subcommand(
      "chat-template", "print the Hugging Face chat template (Jinja) gmod export writes for a conversation template");
  add(*chat, "--template", o->chat_template,
      "conversation template: vicuna_v1, plain, chatml, qwen2_5, qwen3_vl, "
      "llama3, llama3_1 or mistral");
  add(*chat, "--system", o->system, "system prompt (default: the template's)");
  add_flag(*chat, "--no-image-first", o->chat_no_image_first, "keep <image> where the text puts it");
  add_flag(*chat, "--for-processor", o->chat_for_processor,
           "without BOS, as a vision model's export carries it (LlavaProcessor's tokenizer adds BOS)");
  return [o, check, chat] {
    if (chat->parsed()) return run_chat_template(*o);
    return check->parsed() ? run_check(*o) : run_demo(*o);
  };
}

Register reg_data({"data", "validate a dataset (check), write the demo dataset (demo), print a chat template",
                   setup_data});

}  // namespace
}  // namespace gmod::cli

// The processor-side files of a Hugging Face export (see the header for what each holds and which tools read it).
#include "data/hf_processor_files.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <stdexcept>

#include "data/chat_template.h"
#include "data/tokenizer.h"
#include "model/json_file.h"

namespace gmod {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json read_or_empty(const fs::path& p) {
  if (!fs::exists(p)) return json::object();
  json j = load_json_file(p.string());
  if (!j.is_object()) throw std::runtime_error(p.string() + ": expected a JSON object");
  return j;
}

void write_text(const fs::path& p, const std::string& text) {
  const fs::path tmp = p.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << text;
    if (!f.flush()) throw std::runtime_error(tmp.string() + ": cannot write");
  }
  fs::rename(tmp, p);
}

void write_json(const fs::path& p, const json& j) { save_json_file(p.string(), j); }

void set_default(json& j, const char* key, const json& value) {
  if (!j.contains(key)) j[key] = value;
}

// The shortest decimal that reads back as `v` in float: 0.48145466f is written 0.48145466, as CLIP's configs have
// it, not as the double 0.48145467042922974 the float widens to (Python would normalise with that).
double float_decimal(float v) {
  for (int digits = 6; digits <= 9; ++digits) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.*g", digits, double(v));
    const double d = std::strtod(buf, nullptr);
    if (float(d) == v) return d;
  }
  return double(v);
}

json floats(const std::array<float, 3>& a) { return json::array({float_decimal(a[0]), float_decimal(a[1]), float_decimal(a[2])}); }

// The string of a special token id among the spellings the LLM families use.
std::optional<std::string> special_string(const Tokenizer& tok, std::optional<int32_t> id) {
  if (!id) return std::nullopt;
  for (const char* s : {"<s>", "</s>", "<unk>", "<pad>", "<|begin_of_text|>", "<|end_of_text|>", "<|endoftext|>",
                        "<|im_end|>", "<|eot_id|>", "<|finetune_right_pad_id|>"})
    if (tok.token_to_id(s) == id) return std::string(s);
  return std::nullopt;
}

json added_token(const std::string& content) {
  return {{"content", content}, {"lstrip", false}, {"normalized", false}, {"rstrip", false},
          {"single_word", false}, {"special", true}};
}

}  // namespace

void copy_processor_files(const std::string& from, const std::string& to) {
  for (const char* f : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                        "chat_template.jinja", "chat_template.json", "preprocessor_config.json",
                        "processor_config.json", "generation_config.json"}) {
    const fs::path src = fs::path(from) / f;
    if (fs::exists(src)) fs::copy_file(src, fs::path(to) / f, fs::copy_options::overwrite_existing);
  }
}

std::vector<std::string> write_hf_processor_files(const std::string& dir_s, const HfProcessorSpec& spec) {
  const fs::path dir(dir_s);
  const bool has_json = fs::exists(dir / "tokenizer.json");
  if (!has_json && !fs::exists(dir / "tokenizer.model"))
    throw std::runtime_error(dir_s + ": no tokenizer.json or tokenizer.model to describe (copy the tokenizer first)");
  const std::shared_ptr<const Tokenizer> tok = load_tokenizer(dir_s);
  const LlavaConfig& m = spec.model;
  std::vector<std::string> written;
  // The template must fit the tokenizer (its special tokens) before anything is written.
  ConversationConfig cc = spec.conversation;
  cc.image_seq_length = std::max(cc.image_seq_length, 1);
  std::optional<int32_t> stop;
  try {
    stop = ConversationEncoder(tok, cc).end_of_turn_id();
  } catch (const std::invalid_argument& e) {  // e.g. a llama3 template over a tokenizer without <|eot_id|>
    throw std::runtime_error(dir_s + ": template " + cc.template_name + ": " + e.what());
  }

  // tokenizer_config.json: the source's, completed.
  json tc = read_or_empty(dir / "tokenizer_config.json");
  if (!has_json) {  // SentencePiece: transformers' LlamaTokenizer, with gmod's (LLaVA's) legacy handling
    set_default(tc, "tokenizer_class", "LlamaTokenizer");
    set_default(tc, "legacy", true);
    set_default(tc, "add_bos_token", true);
    set_default(tc, "add_eos_token", false);
  } else {
    set_default(tc, "tokenizer_class", "PreTrainedTokenizerFast");
  }
  const std::optional<std::string> bos = special_string(*tok, tok->bos_id()), eos = special_string(*tok, tok->eos_id()),
                                   unk = special_string(*tok, tok->unk_id()), pad = special_string(*tok, tok->pad_id());
  if (bos) set_default(tc, "bos_token", *bos);
  if (eos) set_default(tc, "eos_token", *eos);
  if (unk) set_default(tc, "unk_token", *unk);
  // LLaVA pads with unk (vicuna_v1, plain); the others with their pad token, else EOS.
  if (pad) set_default(tc, "pad_token", *pad);
  else if (unk) set_default(tc, "pad_token", *unk);
  else if (eos) set_default(tc, "pad_token", *eos);
  set_default(tc, "model_max_length", m.text.max_position_embeddings);
  if (m.vision) {
    const std::optional<int32_t> image = tok->token_to_id("<image>");
    if (image && *image != m.image_token_id)
      throw std::runtime_error(dir_s + ": the tokenizer's <image> is id " + std::to_string(*image) +
                               " but the model's image_token_index is " + std::to_string(m.image_token_id) +
                               " (a processor would mark other positions as the image)");
    if (!image) {
      if (m.image_token_id < tok->vocab_size())
        throw std::runtime_error(dir_s + ": the model's image_token_index " + std::to_string(m.image_token_id) +
                                 " is a token of the tokenizer's vocabulary (" + std::to_string(tok->vocab_size()) +
                                 " ids); an <image> added token cannot take it");
      if (!tc.contains("added_tokens_decoder")) tc["added_tokens_decoder"] = json::object();
      tc["added_tokens_decoder"][std::to_string(m.image_token_id)] = added_token("<image>");
      if (has_json) {  // tokenizers reads its added tokens from tokenizer.json, with their ids
        json tj = read_or_empty(dir / "tokenizer.json");
        json entry = added_token("<image>");
        entry["id"] = m.image_token_id;
        tj["added_tokens"].push_back(entry);
        write_json(dir / "tokenizer.json", tj);
        written.push_back("tokenizer.json");
      }
    }
    set_default(tc, "processor_class", "LlavaProcessor");
  }
  const bool has_chat = tc.contains("chat_template") || fs::exists(dir / "chat_template.jinja") ||
                        fs::exists(dir / "chat_template.json");
  if (spec.keep_chat_template && has_chat) {
    write_json(dir / "tokenizer_config.json", tc);
    written.push_back("tokenizer_config.json");
  } else {
    const std::string chat = hf_chat_template(spec.conversation, /*bos_first=*/!m.vision);  // LlavaProcessor adds BOS
    tc["chat_template"] = chat;
    write_json(dir / "tokenizer_config.json", tc);
    write_text(dir / "chat_template.jinja", chat);
    written.insert(written.end(), {"tokenizer_config.json", "chat_template.jinja"});
    if (fs::exists(dir / "chat_template.json")) {  // the source's would name another template
      write_json(dir / "chat_template.json", {{"chat_template", chat}});
      written.push_back("chat_template.json");
    }
  }

  if (!fs::exists(dir / "special_tokens_map.json")) {
    json st = json::object();
    for (const char* k : {"bos_token", "eos_token", "unk_token", "pad_token"})
      if (tc.contains(k)) st[k] = tc[k];
    write_json(dir / "special_tokens_map.json", st);
    written.push_back("special_tokens_map.json");
  }

  if (m.vision && !fs::exists(dir / "preprocessor_config.json")) {
    const ClipPreprocessConfig& p = spec.image;
    write_json(dir / "preprocessor_config.json",
               {{"image_processor_type", "CLIPImageProcessor"}, {"processor_class", "LlavaProcessor"},
                {"do_convert_rgb", true}, {"do_resize", true}, {"size", {{"shortest_edge", p.size}}},
                {"resample", 3}, {"do_center_crop", true}, {"crop_size", {{"height", p.crop}, {"width", p.crop}}},
                {"do_rescale", true}, {"rescale_factor", 1.0 / 255.0}, {"do_normalize", true},
                {"image_mean", floats(p.mean)}, {"image_std", floats(p.std)}});
    written.push_back("preprocessor_config.json");
  }
  // LLaVA-HR and MGM preprocess once, with CLIP's processor at their input size (input_image_size,
  // image_size_aux): the ConvNeXt path reads those pixels, the CLIP path resizes them inside the tower, so no
  // second processor. A config taken over from the CLIP tower's directory (its 336 px) is set to that size, as
  // gmod train sets it.
  if ((m.multipath || m.mgm) && fs::exists(dir / "preprocessor_config.json")) {
    json pc = read_or_empty(dir / "preprocessor_config.json");
    const int side = m.image_input_size();
    const json size = {{"shortest_edge", side}}, crop = {{"height", side}, {"width", side}};
    if (pc.value("size", json()) != size || pc.value("crop_size", json()) != crop) {
      pc["size"] = size;
      pc["crop_size"] = crop;
      write_json(dir / "preprocessor_config.json", pc);
      written.push_back("preprocessor_config.json");
    }
  }
  if (m.vision && !fs::exists(dir / "processor_config.json")) {
    // LlavaProcessor expands <image> to (crop / patch_size)^2 + num_additional_image_tokens ids, minus one
    // (the CLS) with the "default" selection. CLIP: its patch size and the CLS. LLaVA-HR and MGM take a
    // larger image than their CLIP grid and keep no CLS: patch_size is the input pixels per image token along
    // a side, so the count is still image_seq_length (where the tokens form one square grid; MGM's grid of
    // crops does not, stated).
    int patch = m.vision->patch_size, extra = 1;
    if (m.multipath || m.mgm) {
      const int side = m.image_input_size(), tokens = m.image_seq_length();
      int g = 1;
      while ((g + 1) * (g + 1) <= tokens) ++g;
      // Else (MGM's crops plus a global image) not expressible: CLIP's patch size stays.
      if (g * g == tokens && side % g == 0) {
        patch = side / g;
        extra = m.vision_feature_select_strategy == "default" ? 1 : 0;
      }
    }
    write_json(dir / "processor_config.json",
               {{"processor_class", "LlavaProcessor"},
                {"image_token", "<image>"},
                {"patch_size", patch},
                {"num_additional_image_tokens", extra},
                {"vision_feature_select_strategy", m.vision_feature_select_strategy}});
    written.push_back("processor_config.json");
  }

  if (!fs::exists(dir / "generation_config.json")) {
    // Greedy, stopping where gmod generate stops: the template's end of turn.
    json g = {{"do_sample", false}};
    if (tok->bos_id()) g["bos_token_id"] = *tok->bos_id();
    if (stop) g["eos_token_id"] = *stop;
    else if (tok->eos_id()) g["eos_token_id"] = *tok->eos_id();
    if (m.text.pad_token_id) g["pad_token_id"] = *m.text.pad_token_id;
    write_json(dir / "generation_config.json", g);
    written.push_back("generation_config.json");
  }
  return written;
}

}  // namespace gmod

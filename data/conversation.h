// Conversation templates: a Record becomes token ids, labels (-100 = not supervised) and TokenRoles.
//
// Templates (checked against their references in tests/data/test_conversation.cpp, test_chat_templates.cpp)
//   vicuna_v1  LLaVA-1.5 / γ-MoD `conv_vicuna_v1`:
//              "<s>" SYSTEM " USER: q1 ASSISTANT: a1</s>USER: q2 ASSISTANT: a2</s>"
//   plain      LLaVA stage-1 `conv_llava_plain`: "<s>" image caption "\n" (the human text is dropped)
//   chatml     Qwen2 / Qwen1.5 Instruct (no BOS; SYSTEM "You are a helpful assistant."):
//              "<|im_start|>system\nSYSTEM<|im_end|>\n<|im_start|>user\nq1<|im_end|>\n"
//              "<|im_start|>assistant\na1<|im_end|>\n..."
//   qwen2_5    chatml with Qwen2.5 Instruct's default system message ("You are Qwen, created by ...")
//   qwen3_vl   Qwen3-VL Instruct: chatml without a default system message (its template writes the system block
//              only when the conversation has one; a set system message writes it)
//   llama3     Meta-Llama-3-Instruct, every message stripped (the template's `| trim`):
//              "<|begin_of_text|>" ["<|start_header_id|>system<|end_header_id|>\n\nSYSTEM<|eot_id|>"]
//              "<|start_header_id|>user<|end_header_id|>\n\nq1<|eot_id|>"
//              "<|start_header_id|>assistant<|end_header_id|>\n\na1<|eot_id|>..."; SYSTEM defaults to
//              LLaVA-NeXT's `conv_llava_llama_3` message, an empty one drops the system block
//   llama3_1   Llama-3.1/3.2/3.3-Instruct: llama3 with a system block that is always there and starts with
//              "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n" (3.1's default date)
//   mistral    Mistral-7B-Instruct v0.1/v0.2: "<s>[INST] q1 [/INST]a1</s>[INST] q2 [/INST]a2</s>"; no system
//              message by default, one that is set goes before the first question, "SYSTEM\n\nq1" (as v0.3)
//   auto       not a template: resolve_conversation_template picks the model family's (LLaMA-2 vicuna_v1,
//              LLaMA-3 vocabularies llama3 / llama3_1, Qwen2 chatml, Qwen3-VL qwen3_vl, Mistral mistral)
// Only assistant answers and their end-of-turn token ("</s>", "<|im_end|>", "<|eot_id|>"; for plain the
// caption and "\n") are supervised; the "\n" after "<|im_end|>" and the headers are not (LLaVA-NeXT's
// preprocess_qwen / preprocess_llama3 also supervise every header and separator token; docs/data.md). Each
// `<image>` placeholder becomes image_seq_length tokens of id image_token_id, role kImage, or the span given for that
// image (encode's `image_tokens`: native-resolution images, data/image_prep.h).
//
// Tokenisation follows LLaVA's tokenizer_image_token: the prompt is split at `<image>` and every chunk is
// encoded on its own (special strings such as "</s>" inside a chunk are recognised by the tokenizer). Piece
// boundaries inside a chunk (e.g. "... ASSISTANT:" | " answer") are located by encoding the chunk prefix,
// which gives the same labels as preprocess_v1's `len(tok(instruction)) - 2` rule whenever that rule is right
// (the trailing space of "ASSISTANT: " is its own token) - verified against a Python re-implementation in
// tests. Intentional divergences from preprocess_v1 (documented in docs/data.md):
//   * a trailing human turn without an answer is dropped (LLaVA keeps it unsupervised);
//   * a record that would end up with no supervised token is rejected (SampleError "no_answer") instead of
//     training on an all -100 sample; LLaVA's "tokenization mismatch" cannot occur here because labels are
//     derived from the same token sequence, not recomputed from separately tokenised rounds.
#pragma once

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/image_prep.h"
#include "data/records.h"
#include "data/tokenizer.h"
#include "model/token_roles.h"

namespace gmod {

struct LlamaConfig;

constexpr int32_t kIgnoreIndex = -100;

// A record that cannot become a training sample. `reason` is a short stable key used in statistics:
// "malformed", "roles", "no_answer", "placeholder", "image", "too_long".
class SampleError : public std::runtime_error {
 public:
  SampleError(std::string reason, const std::string& what)
      : std::runtime_error(what), reason_(std::move(reason)) {}
  const std::string& reason() const { return reason_; }

 private:
  std::string reason_;
};

struct ConversationConfig {
  std::string template_name = "vicuna_v1";  // see the list above; "auto" must be resolved first
  // Move each `<image>` to the front of its turn ("<image>\n" + rest, stripped), as LLaVA's
  // preprocess_multimodal and γ-MoD's modify_data_config.py do. γ-MoD's routable prefix assumes it.
  bool image_first = true;
  std::optional<std::string> system_prompt;  // overrides the template's default system message
  int32_t image_token_id = 32000;            // LlavaConfig::image_token_id
  int image_seq_length = 576;                // LlavaConfig::image_seq_length()
  std::optional<int32_t> pad_id;  // default: vicuna_v1/plain unk (LLaVA pad = unk), else pad, eos, 0
};

// Default system messages.
extern const char* const kVicunaSystem;
extern const char* const kChatmlSystem;
extern const char* const kQwen25System;
extern const char* const kLlama3System;
extern const char* const kLlama31Preamble;  // the date lines llama3_1 puts before the system message

// The template names ConversationEncoder accepts, and "auto".
bool is_conversation_template(const std::string& name);  // a template or "auto"
const char* conversation_template_list();                // "vicuna_v1, plain, ..., auto" for messages

// "auto" -> the family's template (above); any other name is returned unchanged.
std::string resolve_conversation_template(const std::string& name, const LlamaConfig& llm);

struct EncodedConversation {
  std::vector<int32_t> ids;
  std::vector<int32_t> labels;  // kIgnoreIndex where not supervised
  std::vector<TokenRole> roles;
  std::vector<size_t> round_ends;  // token count after each complete question/answer round
  std::vector<size_t> image_ends;  // token count after each image's tokens (end token included), in order
  std::vector<size_t> video_ends;  // the same for each video
  int num_images = 0;
};

class ConversationEncoder {
 public:
  // Throws std::invalid_argument for an unknown template or a tokenizer lacking what the template needs.
  ConversationEncoder(std::shared_ptr<const Tokenizer> tokenizer, ConversationConfig config);

  // Throws SampleError naming `where` (e.g. "train.json: record 3 (id 'x')").
  EncodedConversation encode(const Record& record, const std::string& where = "record") const;
  // The same with each image's tokens given (data/image_prep.h: one per record image, in order; a native-resolution
  // image's count depends on its size). Without, every image is image_seq_length x image_token_id.
  // `video_tokens`: each record video's span (data/video_prep.h), one per video; a `<video>` placeholder (LLaVA-Video /
  // LLaMA-Factory) stands where its video goes and never moves. A record with videos and no spans is refused.
  EncodedConversation encode(const Record& record, const std::string& where,
                             const std::vector<ImageTokens>& image_tokens,
                             const std::vector<VideoTokens>& video_tokens = {}) const;

  int32_t pad_id() const { return pad_id_; }
  // The token that ends an answer, where generation stops: "</s>" / EOS (vicuna_v1, plain, mistral),
  // "<|im_end|>" (chatml, qwen2_5), "<|eot_id|>" (llama3, llama3_1). A base LLM's tokenizer names another
  // EOS (LLaMA-3's <|end_of_text|>) than the turn end its Instruct model and this template train.
  std::optional<int32_t> end_of_turn_id() const;
  const ConversationConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tok_; }

 private:
  std::shared_ptr<const Tokenizer> tok_;
  ConversationConfig config_;
  int32_t pad_id_ = 0;
  std::optional<int32_t> bos_;
  std::optional<int32_t> eos_;  // mistral: the end of each answer
};

}  // namespace gmod

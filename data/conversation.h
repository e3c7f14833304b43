// Conversation templates: a Record becomes token ids, labels (-100 = not supervised) and TokenRoles.
//
// Templates
//   vicuna_v1  LLaVA-1.5 / γ-MoD `conv_vicuna_v1`: "<s>" SYSTEM " USER: q1 ASSISTANT: a1</s>USER: q2
//   ASSISTANT: a2</s>" plain      LLaVA stage-1 `conv_llava_plain`: "<s>" image caption "\n" (the human text
//   is dropped) chatml     BPE families:
//   "<|im_start|>system\nSYSTEM<|im_end|>\n<|im_start|>user\nq1<|im_end|>\n"
//              "<|im_start|>assistant\na1<|im_end|>\n..." (no BOS)
// Only assistant answers and their end-of-turn token ("</s>", "<|im_end|>"; for plain the caption and "\n")
// are supervised. Each `<image>` placeholder becomes image_seq_length tokens of id image_token_id, role
// kImage.
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

#include "data/records.h"
#include "data/tokenizer.h"
#include "model/token_roles.h"

namespace gmod {

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
  std::string template_name = "vicuna_v1";  // vicuna_v1 | plain | chatml
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

struct EncodedConversation {
  std::vector<int32_t> ids;
  std::vector<int32_t> labels;  // kIgnoreIndex where not supervised
  std::vector<TokenRole> roles;
  std::vector<size_t> round_ends;  // token count after each complete question/answer round
  int num_images = 0;
};

class ConversationEncoder {
 public:
  // Throws std::invalid_argument for an unknown template or a tokenizer lacking what the template needs.
  ConversationEncoder(std::shared_ptr<const Tokenizer> tokenizer, ConversationConfig config);

  // Throws SampleError naming `where` (e.g. "train.json: record 3 (id 'x')").
  EncodedConversation encode(const Record& record, const std::string& where = "record") const;

  int32_t pad_id() const { return pad_id_; }
  const ConversationConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tok_; }

 private:
  std::shared_ptr<const Tokenizer> tok_;
  ConversationConfig config_;
  int32_t pad_id_ = 0;
  std::optional<int32_t> bos_;
};

}  // namespace gmod

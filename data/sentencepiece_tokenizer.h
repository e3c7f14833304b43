// SentencePiece tokenizer (LLaMA-1/2, Vicuna, LLaVA-1.5 `tokenizer.model`) behind the gmod::Tokenizer interface.
//
// Behaviour with parse_special = true matches the slow Hugging Face LlamaTokenizer with legacy=True, which is what
// LLaVA's preprocess_v1 ran on (transformers 4.31) when it tokenised whole prompts such as
// "... ASSISTANT: A1</s>USER: Q2 ASSISTANT: A2</s>":
//   * the text is split on the literal strings of the control and unknown pieces (<s>, </s>, <unk> for LLaMA),
//     leftmost-longest, without stripping whitespace around them;
//   * each remaining chunk is encoded by sentencepiece on its own, so every chunk gets the dummy prefix "▁"
//     ("A1</s>USER" -> [..A1] 2 [▁USER]); LLaVA's round-length arithmetic (len(tok(round))) depends on this;
//   * a special string becomes its single id.
// Plain python `sentencepiece` (= parse_special = false here) instead encodes "</s>" as ordinary text
// ("▁</", "s", ">"), and the newer non-legacy / fast HF tokenizers drop the dummy prefix after a special token;
// neither is what LLaVA-1.5 was trained with.
// decode() is the inverse: runs of regular ids are sentencepiece-decoded (which drops the leading dummy-prefix
// space of each run) and control/unknown ids are written as their piece text ("<s>", "</s>", "<unk>").
// Thread-safe for concurrent encode/decode.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace gmod {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // Loads a serialized ModelProto (`tokenizer.model`). Throws std::runtime_error naming `model_path`.
  explicit SentencePieceTokenizer(const std::string& model_path);
  ~SentencePieceTokenizer() override;

  std::vector<int32_t> encode(const std::string& text, bool parse_special = true) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override;
  std::optional<int32_t> token_to_id(const std::string& token) const override;
  std::optional<int32_t> bos_id() const override;
  std::optional<int32_t> eos_id() const override;
  std::optional<int32_t> pad_id() const override;
  std::optional<int32_t> unk_id() const override;

  // Piece string of an id (e.g. "▁Hello", "<0x0A>", "</s>"). Throws on an id outside [0, vocab_size).
  std::string id_to_piece(int32_t id) const;
  const std::string& path() const { return path_; }

 private:
  static std::optional<int32_t> opt_id(int id) { return id >= 0 ? std::optional<int32_t>(id) : std::nullopt; }
  void encode_plain(const std::string& text, std::vector<int32_t>& out) const;

  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::vector<std::pair<std::string, int32_t>> specials_;  // control + unknown pieces, split out of the text
};

}  // namespace gmod

// Byte-level BPE tokenizer read from a Hugging Face `tokenizer.json` (GPT-2, LLaMA-3, Qwen2, SmolLM families).
//
// Reproduces `tokenizers` (Rust, 0.2x) for this family:
//   * added_tokens are split out first (leftmost-longest; lstrip / rstrip / single_word honoured; tokens with
//     normalized=false before normalized=true ones, as AddedVocabulary does). With parse_special = false the
//     *special* added tokens stay plain text (tokenizers' encode_special_tokens=True); non-special ones still split.
//   * pre_tokenizer: ByteLevel{add_prefix_space, use_regex (GPT-2 regex)}, Split{Regex|String pattern,
//     behavior Isolated|Removed|MergedWithPrevious|MergedWithNext|Contiguous, invert}, Digits{individual_digits},
//     or a Sequence of them ending in ByteLevel. Regexes run on PCRE2 (UTF + UCP, JIT when available).
//   * model BPE: vocab + merges ("a b" strings or [a, b] lists), merges applied by rank with the same priority
//     queue as tokenizers' Word::merge_all; ignore_merges, continuing_subword_prefix, end_of_word_suffix,
//     unk_token / fuse_unk, byte_fallback. A bounded per-word cache makes repeated words O(1).
//   * decode: ByteLevel decoder (chars -> bytes, tokens with chars outside the map kept verbatim), invalid UTF-8
//     replaced by U+FFFD like String::from_utf8_lossy. Special tokens are written out (skip_special_tokens=False).
// Deliberate gaps, rejected with UnsupportedTokenizerError unless noted: models other than BPE (WordPiece, Unigram,
// WordLevel); SentencePiece-style tokenizer.json (Metaspace, no ByteLevel) - load the tokenizer.model instead;
// normalizers other than none / NFC. An NFC normalizer (Qwen2) is accepted but not applied: input is assumed to
// be NFC already, which holds for ordinary corpora. BPE dropout is ignored (it only matters for training-time
// sampling). Invalid UTF-8 input is replaced by U+FFFD before tokenising instead of throwing.
// bos/eos/pad/unk ids come from tokenizer_config.json (then special_tokens_map.json) next to the tokenizer.json,
// since tokenizer.json itself does not say which added token plays which role; unk also falls back to
// model.unk_token. Thread-safe for concurrent encode/decode.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace gmod {

// The file is readable and well-formed but asks for something this implementation does not do.
class UnsupportedTokenizerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class BpeTokenizer final : public Tokenizer {
 public:
  // Reads `json_path` and, if present, tokenizer_config.json / special_tokens_map.json beside it.
  // Throws std::runtime_error naming the path (unreadable, malformed JSON, missing fields) or
  // UnsupportedTokenizerError (unsupported model / pre-tokenizer / normalizer).
  explicit BpeTokenizer(const std::string& json_path);
  // From in-memory text; `origin` names the source in errors; `config_json` is tokenizer_config.json text or "".
  static std::unique_ptr<BpeTokenizer> from_string(const std::string& json_text, const std::string& origin,
                                                   const std::string& config_json = "");
  ~BpeTokenizer() override;

  std::vector<int32_t> encode(const std::string& text, bool parse_special = true) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  // Highest id + 1 over vocab and added tokens (tokenizers' get_vocab_size(with_added_tokens=True)).
  int32_t vocab_size() const override;
  std::optional<int32_t> token_to_id(const std::string& token) const override;
  std::optional<int32_t> bos_id() const override;
  std::optional<int32_t> eos_id() const override;
  std::optional<int32_t> pad_id() const override;
  std::optional<int32_t> unk_id() const override;

  // Token string of an id in its stored (byte-level mapped) form, e.g. "Ġthe"; nullopt if the id is unused.
  std::optional<std::string> id_to_token(int32_t id) const;
  // Is `id` one of the added tokens flagged special?
  bool is_special(int32_t id) const;
  const std::string& origin() const;

 private:
  struct Impl;
  BpeTokenizer() = default;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gmod

// Tokenizer interface shared by the SentencePiece and byte-level BPE implementations.
// Ids are int32 (LLaMA-2: 32000 vocab, LLaMA-3: 128256). Encoding never adds BOS/EOS by itself;
// templates decide where those go.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace gmod {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Text -> ids, without BOS/EOS. Special tokens written literally in the text (e.g. "<|im_end|>")
  // are recognised as single ids when `parse_special` is true.
  virtual std::vector<int32_t> encode(const std::string& text, bool parse_special = true) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int32_t vocab_size() const = 0;
  // Id of a token string (special or regular), if the vocabulary has it.
  virtual std::optional<int32_t> token_to_id(const std::string& token) const = 0;
  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::optional<int32_t> eos_id() const = 0;
  virtual std::optional<int32_t> pad_id() const = 0;
  virtual std::optional<int32_t> unk_id() const = 0;
};

// Opens `path`: a SentencePiece `tokenizer.model` or a Hugging Face `tokenizer.json`, or a directory
// holding one of them (tokenizer.json preferred). Throws with the path on anything unreadable.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

}  // namespace gmod

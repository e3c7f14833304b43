// SentencePiece tokenizer: LLaVA / slow-LlamaTokenizer(legacy) handling of special tokens around libsentencepiece.
#include "data/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace gmod {

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path)
    : path_(model_path), sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  std::ifstream in(model_path, std::ios::binary);
  if (!in) throw std::runtime_error("SentencePiece model '" + model_path + "': cannot open file");
  std::ostringstream buf;
  buf << in.rdbuf();
  const auto status = sp_->LoadFromSerializedProto(buf.str());
  if (!status.ok())
    throw std::runtime_error("SentencePiece model '" + model_path +
                             "': not a valid sentencepiece ModelProto (" + status.ToString() + ")");
  for (int i = 0; i < sp_->GetPieceSize(); ++i) {
    if (sp_->IsControl(i) || sp_->IsUnknown(i)) {
      const std::string& piece = sp_->IdToPiece(i);
      if (!piece.empty()) specials_.emplace_back(piece, i);
    }
  }
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

void SentencePieceTokenizer::encode_plain(const std::string& text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::vector<int> ids;
  const auto status = sp_->Encode(text, &ids);
  if (!status.ok())
    throw std::runtime_error("SentencePiece model '" + path_ + "': encode failed (" + status.ToString() + ")");
  out.insert(out.end(), ids.begin(), ids.end());
}

std::vector<int32_t> SentencePieceTokenizer::encode(const std::string& text, bool parse_special) const {
  std::vector<int32_t> out;
  if (!parse_special || specials_.empty()) {
    encode_plain(text, out);
    return out;
  }
  size_t pos = 0;
  // next[k]: next occurrence of specials_[k] at or after some earlier pos; refreshed only once passed, so the
  // scan stays linear in the text length however many specials it holds.
  std::vector<size_t> next;
  for (const auto& s : specials_) next.push_back(text.find(s.first));
  while (pos < text.size()) {
    // Leftmost occurrence of any special string; the longest one on ties (the HF trie's behaviour).
    size_t best = std::string::npos;
    const std::pair<std::string, int32_t>* hit = nullptr;
    for (size_t k = 0; k < specials_.size(); ++k) {
      const auto& s = specials_[k];
      if (next[k] != std::string::npos && next[k] < pos) next[k] = text.find(s.first, pos);
      const size_t at = next[k];
      if (at == std::string::npos) continue;
      if (at < best || (at == best && s.first.size() > hit->first.size())) {
        best = at;
        hit = &s;
      }
    }
    if (!hit) {
      encode_plain(text.substr(pos), out);
      break;
    }
    if (best > pos) encode_plain(text.substr(pos, best - pos), out);
    out.push_back(hit->second);
    pos = best + hit->first.size();
  }
  return out;
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  std::vector<int> run;
  auto flush = [&] {
    if (run.empty()) return;
    std::string piece;
    const auto status = sp_->Decode(run, &piece);
    if (!status.ok())
      throw std::runtime_error("SentencePiece model '" + path_ + "': decode failed (" + status.ToString() + ")");
    out += piece;
    run.clear();
  };
  const int n = sp_->GetPieceSize();
  for (int32_t id : ids) {
    if (id < 0 || id >= n)
      throw std::out_of_range("SentencePiece model '" + path_ + "': id " + std::to_string(id) +
                              " outside the vocabulary [0, " + std::to_string(n) + ")");
    if (sp_->IsControl(id) || sp_->IsUnknown(id)) {
      flush();
      out += sp_->IdToPiece(id);
    } else {
      run.push_back(id);
    }
  }
  flush();
  return out;
}

int32_t SentencePieceTokenizer::vocab_size() const { return sp_->GetPieceSize(); }

std::optional<int32_t> SentencePieceTokenizer::token_to_id(const std::string& token) const {
  const int id = sp_->PieceToId(token);  // returns unk_id for unknown pieces
  if (id < 0 || id >= sp_->GetPieceSize() || sp_->IdToPiece(id) != token) return std::nullopt;
  return id;
}

std::string SentencePieceTokenizer::id_to_piece(int32_t id) const {
  if (id < 0 || id >= sp_->GetPieceSize())
    throw std::out_of_range("SentencePiece model '" + path_ + "': id " + std::to_string(id) + " out of range");
  return sp_->IdToPiece(id);
}

std::optional<int32_t> SentencePieceTokenizer::bos_id() const { return opt_id(sp_->bos_id()); }
std::optional<int32_t> SentencePieceTokenizer::eos_id() const { return opt_id(sp_->eos_id()); }
std::optional<int32_t> SentencePieceTokenizer::pad_id() const { return opt_id(sp_->pad_id()); }
std::optional<int32_t> SentencePieceTokenizer::unk_id() const { return opt_id(sp_->unk_id()); }

}  // namespace gmod

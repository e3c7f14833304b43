#include "serve/answer_text.h"

#include <algorithm>

namespace gmod::serve {

bool apply_stop(std::string& text, const std::vector<std::string>& stop) {
  size_t cut = std::string::npos;
  for (const auto& s : stop) cut = std::min(cut, text.find(s));
  if (cut == std::string::npos) return false;
  text.resize(cut);
  return true;
}

namespace {

// Bytes at the end of `text` that may still change when more tokens come: an incomplete UTF-8 sequence,
// replacement characters (what a tokenizer makes of a partial byte sequence), or the start of a stop string.
size_t unstable_suffix(const std::string& text, const std::vector<std::string>& stop) {
  size_t hold = 0;
  static const std::string kReplacement = "\xEF\xBF\xBD";
  // A partial byte sequence decodes to one replacement character per byte: hold back the whole run.
  while (text.size() >= hold + 3 && text.compare(text.size() - hold - 3, 3, kReplacement) == 0) hold += 3;
  // An incomplete UTF-8 sequence: a lead byte without all its continuation bytes.
  for (size_t back = 1; back <= std::min<size_t>(4, text.size()); ++back) {
    const auto c = static_cast<unsigned char>(text[text.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (need > back) hold = std::max(hold, back);
    break;
  }
  for (const auto& s : stop)
    for (size_t k = std::min(s.size() - 1, text.size()); k > hold; --k)
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  return hold;
}

}  // namespace

AnswerText::AnswerText(std::shared_ptr<const Tokenizer> tokenizer, std::vector<std::string> stop,
                       int64_t max_tokens, int64_t eos_id)
    : tok_(std::move(tokenizer)), stop_(std::move(stop)), max_tokens_(max_tokens), eos_id_(eos_id) {}

std::string AnswerText::take(size_t upto) {
  // Deltas only ever extend what was given out; text that changed under it (not seen with SentencePiece or
  // byte-level BPE) is not streamed again.
  if (upto <= emitted_.size() || text_.compare(0, emitted_.size(), emitted_) != 0) return {};
  std::string delta = text_.substr(emitted_.size(), upto - emitted_.size());
  emitted_ += delta;
  return delta;
}

std::string AnswerText::add(int64_t id) {
  if (finished_) return {};
  if (eos_id_ >= 0 && id == eos_id_) {
    finished_ = eos_ = true;
    reason_ = "stop";
    return take(text_.size());
  }
  ids_.push_back(static_cast<int32_t>(id));
  text_ = tok_->decode(ids_);
  if (apply_stop(text_, stop_)) {
    finished_ = true;
    reason_ = "stop";
  } else if (int64_t(ids_.size()) >= max_tokens_) {
    finished_ = true;
    reason_ = "length";
  }
  return take(finished_ ? text_.size() : text_.size() - unstable_suffix(text_, stop_));
}

std::string AnswerText::end() {
  if (finished_) return {};
  finished_ = true;
  reason_ = "length";
  return take(text_.size());
}

Completion AnswerText::completion(int64_t prompt_tokens) const {
  Completion c;
  c.text = text_;
  c.finish_reason = reason_;
  c.prompt_tokens = prompt_tokens;
  c.completion_tokens = int64_t(ids_.size()) + (eos_ ? 1 : 0);
  return c;
}

}  // namespace gmod::serve

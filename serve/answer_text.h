// `gmod serve`: one request's answer built token by token: the text decoded so far, cut at the first stop
// string, and the part of it that is final and may be streamed. Text that could still change is held back: a
// trailing incomplete UTF-8 character (a byte-fallback token's first bytes decode to U+FFFD) and a suffix
// that is the start of a stop string. The streamed deltas add up to the final text. Independent of batching:
// a request keeps its AnswerText whichever batch or step it is decoded in.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "serve/request_state.h"

namespace gmod::serve {

class AnswerText {
 public:
  AnswerText(std::shared_ptr<const Tokenizer> tokenizer, std::vector<std::string> stop, int64_t max_tokens,
             int64_t eos_id);
  // Adds a generated token; returns the text that became final with it (often empty). Ends the answer at EOS,
  // a stop string or max_tokens. Not to be called once finished().
  std::string add(int64_t id);
  // Ends an unfinished answer (the generation ended first): finish_reason "length"; returns the rest.
  std::string end();
  bool finished() const { return finished_; }
  Completion completion(int64_t prompt_tokens) const;

 private:
  std::string take(size_t upto);

  std::shared_ptr<const Tokenizer> tok_;
  std::vector<std::string> stop_;
  int64_t max_tokens_, eos_id_;
  std::vector<int32_t> ids_;
  std::string text_;     // decode(ids_), cut at a stop string once one appeared
  std::string emitted_;  // the prefix of text_ given out so far
  bool finished_ = false, eos_ = false;
  std::string reason_;
};

// Cuts `text` at the first occurrence of any stop string; true when one was found.
bool apply_stop(std::string& text, const std::vector<std::string>& stop);

}  // namespace gmod::serve

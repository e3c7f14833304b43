// The question ids of an answer file as the original script keys them: a question answered on more than one
// line is a named problem that says which line the original keeps (a dict built from the lines keeps the
// last; a script that walks the lines scores every one). Used by every scorer so that a repeated line is
// never counted, or dropped, without a word.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "eval/records.h"

namespace gmod::eval {

enum class Repeats {
  kLastWins,  // the script builds {id: line}: the last line is scored, the earlier ones are not
  kAllCount,  // the script scores every line: the question counts as often as it is answered
};

class AnswerIds {
 public:
  // `script` names the original ("eval_science_qa.py") in the messages.
  AnswerIds(std::string script, Repeats rule) : script_(std::move(script)), rule_(rule) {}
  // Notes `key` (id_key, or any key the script matches by) answered at `where`; `shown` is the id as written.
  // Returns true the first time, and adds a problem (naming the first line and which one counts) after.
  bool add(const std::string& key, const std::string& shown, const std::string& where,
           std::vector<Problem>* problems);
  bool contains(const std::string& key) const { return first_.count(key) > 0; }
  // Where `key` was answered first ("" when never).
  std::string first(const std::string& key) const;

 private:
  std::string script_;
  Repeats rule_;
  std::map<std::string, std::string> first_;
};

}  // namespace gmod::eval

// Repeated answer lines as named problems (see answer_ids.h).
#include "eval/answer_ids.h"

namespace gmod::eval {

bool AnswerIds::add(const std::string& key, const std::string& shown, const std::string& where,
                    std::vector<Problem>* problems) {
  const auto [it, fresh] = first_.emplace(key, where);
  if (fresh) return true;
  problems->push_back(
      {where, "question " + shown + " answered again (first at " + it->second + "): " + script_ +
                  (rule_ == Repeats::kLastWins ? " keeps the last of these lines, as gmod does"
                                               : " scores every one of these lines, as gmod does")});
  return false;
}

std::string AnswerIds::first(const std::string& key) const {
  const auto it = first_.find(key);
  return it == first_.end() ? std::string() : it->second;
}

}  // namespace gmod::eval

// MMMU's answer parsing and matching (MMMU's mmmu/utils/eval_utils.py): parse_multi_choice_response (an
// option letter from "(A)", " A ", or the option's text in a long answer; the last one when several; a random
// option when none, with Python's random seeded 42 as the module does), parse_open_response (the tail after
// "is", "so", "therefore", "=" ... and every number in it, normalised: numbers rounded to 2 decimals, text
// lower-cased), eval_multi_choice and eval_open. Used by score_mmmu.h.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "eval/py_random.h"

namespace gmod::eval::mmmu {

// A normalised open-answer candidate: a number or a string (Python's mixed list).
struct Value {
  bool is_number = false;
  double number = 0;
  std::string text;
  bool operator==(const Value& o) const {
    return is_number == o.is_number && (is_number ? number == o.number : text == o.text);
  }
};

// parse_multi_choice_response; `index2ans` in the file's key order; `random_used` tells whether the random
// fallback picked the answer.
std::string parse_multi_choice(const std::string& response, const std::vector<std::string>& all_choices,
                               const std::vector<std::pair<std::string, std::string>>& index2ans,
                               PyRandom& rng, bool* random_used);
// normalize_str.
std::vector<Value> normalize(const std::string& s);
// extract_numbers: numbers with thousands commas, then scientific notation, then plain numbers.
std::vector<std::string> extract_numbers(const std::string& s);
// parse_open_response (duplicates removed).
std::vector<Value> parse_open(const std::string& response);
// eval_open: `gold` holds one or more reference answers.
bool eval_open(const std::vector<std::string>& gold, const std::vector<Value>& pred);

}  // namespace gmod::eval::mmmu

// MMMU's samples as questions for `gmod answer --format mmmu`, asked as γ-MoD's gamma_mod/eval/model_mmmu.py
// asks them (MMMU's construct_prompt with its llava_config): multiple choice "question\n(A) a\n(B)
// b\n\nAnswer with the option's letter from the given choices directly.", open "question\nAnswer the question
// using a single word or phrase.", the image (image_1) before the text. The samples are MMMU's Hugging Face
// rows exported to a JSON list or JSON lines (docs/eval.md): {id, question, options, answer, question_type,
// image_1} with options a Python list literal as the dataset stores it ("['a', 'b']") or a JSON list, and
// image_1 the image's path relative to the image folder. The answer record is MMMU's output.json record
// {id, question_type, answer, all_choices, index2ans, response} that MMMU's main_parse_and_eval.py and
// `gmod score mmmu` read.
#pragma once

#include <string>
#include <vector>

#include "eval/records.h"

namespace gmod::eval {

struct MmmuQuestion {
  std::string id, text, image, where;
  Json fields;  // {question_type, answer, all_choices, index2ans} (the last two for multiple choice)
};

// The sample as asked; false (and a problem naming the record) when a field is missing or mistyped or the
// options cannot be read.
bool read_mmmu_question(const Record& r, MmmuQuestion* q, std::vector<Problem>* problems);

// A Python list literal of string literals ("['a', \"b\\'s\"]"); throws std::invalid_argument saying where
// it stops being one.
std::vector<std::string> parse_python_string_list(const std::string& s);

}  // namespace gmod::eval

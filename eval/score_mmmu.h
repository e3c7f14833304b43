// MMMU accuracy as MMMU's main_parse_and_eval.py computes it (mmmu/utils/eval_utils.py, mmmu_parse.h):
// multiple-choice answers parsed to a letter and compared with the answer (or any of a list of answers), open
// answers parsed to candidate strings/numbers and matched with eval_open; accuracy per category (the id's
// middle words, "validation_Art_Theory_3" -> Art_Theory) and over all questions. --answers MMMU's output.json
// records (a JSON list or JSON lines) {id, question_type, answer, response, all_choices, index2ans}.
// Unparsable multiple-choice answers get a random option as in the original (Python's generator seeded 42, in
// file order); their count is reported.
#pragma once

#include "eval/score.h"

namespace gmod::eval {

ScoreResult score_mmmu(const ScoreInputs& in);

}  // namespace gmod::eval

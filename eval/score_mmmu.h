// MMMU accuracy as MMMU's main_parse_and_eval.py computes it (parse-and-eval mode) (mmmu/utils/eval_utils.py,
// mmmu_parse.h): multiple-choice answers parsed to a letter and compared with the answer (or any of a list of
// answers), open answers parsed to candidate strings/numbers and matched with eval_open; accuracy per
// category (the id's middle words, "validation_Art_Theory_3" -> Art_Theory) and over all questions. --answers
// MMMU's output.json records (a JSON list or JSON lines) {id, question_type, answer, response, all_choices,
// index2ans}. Unparsable multiple-choice answers get a random option as in the original (Python's generator
// seeded 42, in file order); their count is reported.
#pragma once

#include "eval/score.h"

namespace gmod::eval {

ScoreResult score_mmmu(const ScoreInputs& in);
// Eval-only mode (chosen by score_mmmu when --answers is one JSON object): --answers the {id: prediction}
// file γ-MoD's model_mmmu.py writes (multiple-choice predictions already parsed to a letter, open ones the
// raw response) and --annotations MMMU's answer dict {id: {question_type, ground_truth}}, scored as γ-MoD's
// eval_mmmu_only.py (MMMU's main_eval_only.py): subjects in MMMU's order, open predictions through
// parse_open_response, letters compared as they are; per subject and discipline round(acc, 3) as it prints
// them (figures.printable_results), unrounded in figures.accuracy/categories. Ids of an unknown subject or a
// subject absent from the dict (skipped by the original), ids the dict lacks (it stops), dict ids without a
// prediction (left out) and repeated keys are named problems.
ScoreResult score_mmmu_eval_only(const ScoreInputs& in);

// An open question's gold answer(s), a string or a list of strings, into `out` (a non-string list element as "");
// false when `gold` is neither or a list element is not a string.
bool open_gold_strings(const Json& gold, std::vector<std::string>& out);

}  // namespace gmod::eval

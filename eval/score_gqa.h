// GQA accuracy: exact match of the answer after LLaVA's scripts/convert_gqa_for_eval.py (trailing '.'
// removed, lower case) against the question's "answer" in GQA's questions file, over every question of that
// file, as GQA's eval.py does (accuracy; plus per structural type). --answers (question_id, text) jsonl;
// --annotations e.g. testdev_balanced_questions.json ({question_id: {"answer", "types": {"structural"}}}). A
// question without an answer counts as wrong and is named; an answer without a question is named.
#pragma once

#include "eval/score.h"

namespace gmod::eval {

ScoreResult score_gqa(const ScoreInputs& in);

}  // namespace gmod::eval

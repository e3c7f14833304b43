// MME perception and cognition scores as MME's calculation.py (LLaVA's scripts/v1_5/eval/mme.sh) and
// lmms-eval's tasks/mme compute them: an answer is "yes"/"no" when, lower-cased, stripped and without '.', it
// is that word, "y"/"n", or its first four characters hold "yes" (else "no"); else "other" (wrong). Per
// category (every image has two questions) score = acc + acc+ (acc: % of questions right; acc+: % of images
// with both right); perception and cognition are the sums over their categories. --answers (question_id,
// prompt, text) jsonl; --annotations MME's release folder (MME_Benchmark_release_version, matched as LLaVA's
// convert_answer_to_mme.py matches: eval/mme_release.h) or a jsonl of {question_id, category, question,
// answer}, matched by question_id and prompt == question.
#pragma once

#include <string>

#include "eval/score.h"

namespace gmod::eval {

ScoreResult score_mme(const ScoreInputs& in);

// "yes", "no" or "other", as the MME scripts read an answer.
std::string mme_label(const std::string& text);

}  // namespace gmod::eval

// ScienceQA multiple-choice accuracy as LLaVA's llava/eval/eval_science_qa.py computes it: for every problem
// of the split (pid_splits.json) the answer's letter is taken when the text is exactly "A".."E", starts with
// "A. ", or holds exactly one "The answer is X."; anything else (or no answer) is FAILED, which is wrong.
// Accuracy over all problems of the split and over those whose prompt had an image ("IMG", the γ-MoD paper's
// SQA-IMG). --answers (question_id, prompt, text) jsonl; --annotations the ScienceQA dir holding
// problems.json and pid_splits.json (or those two files, in that order); --split (default test).
#pragma once

#include <string>
#include <vector>

#include "eval/score.h"

namespace gmod::eval {

ScoreResult score_scienceqa(const ScoreInputs& in);

// The letter eval_science_qa.py reads from an answer text, or "FAILED".
std::string scienceqa_letter(const std::string& text);

}  // namespace gmod::eval

// ScienceQA multiple-choice accuracy as eval_science_qa.py computes it: for every problem of the split
// (pid_splits.json) the answer's letter is taken when the text is exactly "A".."E", when it has at least
// three characters and starts with one of those letters (--rule gamma-mod, the default: γ-MoD's copy of the
// script, which the paper's table used) or starts with "A. " (--rule llava: upstream LLaVA's), or when it
// holds exactly one "The answer is X."; anything else (or no answer) is FAILED, which is wrong. A repeated
// answer line: the last one counts (the script's dict). Accuracy over all problems of the split and over
// those whose prompt had an image ("IMG", the γ-MoD paper's SQA-IMG). --answers (question_id, prompt, text)
// jsonl; --annotations the ScienceQA dir holding problems.json and pid_splits.json (or those two files, in
// that order); --split (default test).
#pragma once

#include <string>
#include <vector>

#include "eval/score.h"

namespace gmod::eval {

ScoreResult score_scienceqa(const ScoreInputs& in);

// The letter eval_science_qa.py reads from an answer text under `rule` ("gamma-mod" or "llava"), or "FAILED".
std::string scienceqa_letter(const std::string& text, const std::string& rule);

}  // namespace gmod::eval

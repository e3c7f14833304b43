// POPE accuracy, precision, recall, F1 and yes-ratio per split as LLaVA's llava/eval/eval_pope.py computes
// them: the answer's first sentence, commas removed, split on spaces, is "no" when a word is "No", "not" or
// "no", else "yes"; the label "no" is negative, any other label positive; answers of a category are paired in
// file order with the lines of its label file (coco_pope_<category>.json). --answers (question_id, text)
// jsonl;
// --questions the question jsonl (question_id, category); --annotations the label files or the folder holding
// them. Answer/label count mismatches, unknown question ids and categories without a label file are named.
#pragma once

#include <string>

#include "eval/score.h"

namespace gmod::eval {

ScoreResult score_pope(const ScoreInputs& in);

// true when eval_pope.py reads the answer as "yes".
bool pope_says_yes(const std::string& text);

}  // namespace gmod::eval

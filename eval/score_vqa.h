// TextVQA and VQAv2 accuracy as LLaVA's llava/eval/eval_textvqa.py and m4c_evaluator.py compute it: each
// answer normalised (vqa_normalize.h) and scored against the 10 human answers by min(#matching others / 3, 1)
// averaged over the 10 leave-one-out subsets; the accuracy is the mean over answers.
//   textvqa: --answers (question_id, prompt, text) jsonl; --annotations TextVQA_0.5.1_val.json. An answer is
//            matched to its annotation by (image_id, question) with the question taken from the prompt as the
//            original's prompt_processor does.
//   vqav2:   --answers (question_id, text) jsonl; --annotations the VQA v2 annotations json
//            ({"annotations": [{"question_id", "answers": [{"answer"}...]}]}), matched by question_id. (The
//            official VQAv2 test server scores with its own vqaEval.py; gmod follows m4c as LLaVA's TextVQA
//            script does, docs/eval.md.)
#pragma once

#include <string>
#include <vector>

#include "eval/score.h"

namespace gmod::eval {

ScoreResult score_textvqa(const ScoreInputs& in);
ScoreResult score_vqav2(const ScoreInputs& in);

// The soft score of one (already normalised) answer against the (normalised) human answers; `gt` must
// hold 10.
double vqa_soft_score(const std::string& pred, const std::vector<std::string>& gt);
// The question of a TextVQA prompt (eval_textvqa.py's prompt_processor, lower-cased); false when the prompt
// has none of the shapes it knows.
bool textvqa_question(const std::string& prompt, std::string* question);

}  // namespace gmod::eval

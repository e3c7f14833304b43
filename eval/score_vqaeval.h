// VQAv2 accuracy as the VQA evaluation γ-MoD's repository runs computes it (gamma_mod/eval/vqa.py VQA.loadRes
// and vqa_eval.py VQAEval.evaluate, driven as eval_okvqa.py drives them; the VQA challenge's vqaEval.py):
//   * the prediction: newlines and tabs to spaces, stripped, processPunctuation (VQAEval's digit-comma rule)
//     and processDigitArticle (vqa_normalize.h);
//   * the human answers: left as they are when all of them agree, else processPunctuation only (no lower
//     case, no number words);
//   * per human answer, min(1, #other answers equal to the prediction / 3), "other" meaning the answer
//     records (dicts) that differ from it; the question's accuracy is their mean;
//   * overall, per question type and per answer type: round(100 * mean, 2), types in first-seen order.
// A question of the annotations without an answer, an answer to a question not in them (the original
// asserts both), a repeated answer line (the last one counts: loadRes's index), a question without
// question_type/answer_type or without answers (the original stops with KeyError/ZeroDivisionError) are named
// problems. --answers (question_id, text) jsonl; --annotations the VQA annotation json; --questions
// (optional) the VQA question json, read as loadRes reads it (its
// info/task_type/data_type/data_subtype/license, and each answer must be one of the question's
// multiple_choices when task_type is "Multiple Choice").
#pragma once

#include <string>

#include "eval/score.h"

namespace gmod::eval {

ScoreResult score_vqav2_vqaeval(const ScoreInputs& in);

// The prediction as VQAEval.evaluate compares it.
std::string vqaeval_prediction(const std::string& answer);

// Python's == on JSON values: dicts by keys regardless of order, 1 == 1.0 == True.
bool py_equal(const Json& a, const Json& b);

}  // namespace gmod::eval

// MMBench circular evaluation as lmms-eval's tasks/mmbench (MMBench_Evaluator.eval_result with the "static"
// method, no GPT judge) computes it: a question counts only when the answers to it and to every circular copy
// of it (TSV index + k * 1e6, options rotated) are right. The letter of an answer is inferred as the MMBench
// evaluator's can_infer does (a lone option letter, "A.", "(A)", ... or exactly one option text in the
// answer); otherwise with lmms-eval's extract_mcq_answer. --answers (question_id = TSV index, text) jsonl as
// LLaVA's model_vqa_mmbench writes it; --annotations the MMBench TSV (index, question, A..D, answer,
// category, l2-category). Accuracy overall, per category and per l2-category.
#pragma once

#include <map>
#include <string>

#include "eval/score.h"

namespace gmod::eval {

ScoreResult score_mmbench(const ScoreInputs& in);

// The evaluator's can_infer: a letter "A".."E" or "" when nothing can be inferred; `choices` letter -> text.
std::string mmbench_can_infer(const std::string& answer, const std::map<char, std::string>& choices);
// lmms-eval's extract_mcq_answer with the given choice letters; "" when none is found.
std::string mmbench_extract_mcq(const std::string& response, const std::vector<std::string>& choices);

}  // namespace gmod::eval

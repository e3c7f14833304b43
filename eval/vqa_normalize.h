// The VQA answer normalisation of the EvalAI / m4c evaluator (LLaVA's llava/eval/m4c_evaluator.py,
// EvalAIAnswerProcessor), step by step as the original does it: lower case, drop ',' and '?', split "'s",
// punctuation removed or turned into spaces, '.' removed unless a digit follows (at most 32 of them, as the
// original's re.sub count argument), number words zero..ten to digits, articles dropped, contractions
// restored. Used by the TextVQA and VQAv2 scorers (score_vqa.h).
#pragma once

#include <string>
#include <string_view>

namespace gmod::eval {

std::string normalize_vqa_answer(std::string_view answer);

}  // namespace gmod::eval

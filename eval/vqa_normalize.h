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

// The two steps both evaluators share. processPunctuation: each mark removed when it touches a space or a
// digit-comma-digit occurs anywhere (m4c: (?<=\d)(,)+(?=\d); VQAEval's vqaEval.py: (\d)(,)(\d)), else turned
// into a space; then '.' not followed by a digit removed (at most 32). processDigitArticle: lower-cased,
// split on whitespace, number words to digits, articles dropped, contractions restored, joined by spaces.
enum class VqaCommaRule { kM4c, kVqaEval };
std::string vqa_process_punctuation(const std::string& in, VqaCommaRule comma);
std::string vqa_process_digit_article(const std::string& in);

}  // namespace gmod::eval

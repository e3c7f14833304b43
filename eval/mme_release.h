// MME's release folder (MME_Benchmark_release_version) read as questions: one folder per category (task),
// whose question files `<image stem>.txt` hold one "question<TAB>answer" line per question (two per image),
// either beside the images or in questions_answers_YN/ with the images in images/. LLaVA's llava_mme.jsonl
// holds these questions in model_vqa_loader's form (question_id = image = the image's path in the release;
// text = the question without "Please answer yes or no." plus "\nAnswer the question using a single word or
// phrase."), and its convert_answer_to_mme.py finds an answer's question again by the id's first path part
// (category), its file stem (question file) and the prompt with the yes/no instruction put back. Both
// directions are here, for `gmod answer --format mme` and `gmod score mme --annotations MME_DIR`.
#pragma once

#include <string>
#include <vector>

#include "eval/records.h"

namespace gmod::eval {

struct MmeQuestion {
  std::string category;  // the folder name ("OCR", "artwork", "code_reasoning", ...)
  std::string image;     // relative to the release folder: "artwork/images/10002.jpg", "OCR/0001.jpg"
  std::string file;      // the question file's name: "10002.txt"
  std::string question;  // as released, with "Please answer yes or no."
  std::string answer;    // as released ("Yes"/"No")
  std::string where;     // the question file's path and line
};

// Every question of the release in category, file and line order (folders and files sorted by name). A line
// that is not "question<TAB>answer", or a question file without an image of its stem, is a problem (named
// by file and line) and left out. Throws std::runtime_error when `dir` is not a readable folder.
std::vector<MmeQuestion> read_mme_release(const std::string& dir, std::vector<Problem>* problems);

// What LLaVA's llava_mme.jsonl asks for a released question.
std::string mme_llava_text(const std::string& question);

// The (category, question file) convert_answer_to_mme.py files an answer under, from its question_id.
std::pair<std::string, std::string> mme_answer_file(const std::string& question_id);
// The released questions convert_answer_to_mme.py tries for an answer's prompt, in its order.
std::vector<std::string> mme_released_questions(const std::string& prompt);

}  // namespace gmod::eval

// The question files of the benchmarks' answering scripts, read into one form for `gmod answer`
// (docs/eval.md), and the answer record each script writes back: LLaVA's model_vqa_loader jsonl
// (question_id, image, text), model_vqa_science's ScienceQA json list (id, image, conversations) and
// model_vqa_mmbench's TSV (base64 images, hint, options). No LibTorch: images are returned as paths or bytes
// for the caller to decode.
#pragma once

#include <string>
#include <vector>

#include "eval/records.h"

namespace gmod::eval {

enum class QuestionFormat { kLoader, kScience, kMmbench };

// The format named on the command line (auto, loader, science, mmbench); "auto" decides by the path:
// ".tsv" is MMBench, a JSON list ScienceQA, else the loader jsonl. Throws std::invalid_argument for an unknown name.
QuestionFormat question_format(const std::string& name, const std::string& path);
const char* format_name(QuestionFormat f);

struct Question {
  Json id;              // the id the answer records (question_id, or MMMU's id)
  std::string text;     // what the model is asked (the image goes before it)
  std::string prompt;   // what the answer file records as "prompt" (as the original script writes it)
  std::string image;    // image path relative to the image folder ("" = none, or the bytes below)
  std::string image_bytes;  // MMBench: the decoded base64 image
  Json options;             // MMBench: the options as asked (written with round_id and option_char)
  std::string where;        // file:line or file[#i]
};

// Every usable question of `path` in file order; a record that cannot be read (not JSON, no id, no text) is
// added to `problems` by where it is, and left out. `single_pred` appends
// "Answer with the option's letter from the given choices directly." as LLaVA's ScienceQA and MMBench runs do.
// Throws std::runtime_error when the file or folder cannot be read at all.
std::vector<Question> read_questions(const std::string& path, QuestionFormat format, bool single_pred,
                                     std::vector<Problem>* problems);

// The answer record the format's original script writes for `q` answered `text` (stripped by the caller):
// model_vqa_loader/science {question_id, prompt, text, answer_id, model_id, metadata}; MMBench adds round_id,
// options, option_char.
Json answer_record(const Question& q, QuestionFormat format, const std::string& text,
                   const std::string& answer_id, const std::string& model_id);

// RFC 4648 base64 (and its URL-safe alphabet), whitespace and padding ignored; throws std::invalid_argument
// naming `where` on any other character.
std::string base64_decode(const std::string& in, const std::string& where);

}  // namespace gmod::eval

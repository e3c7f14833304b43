// The question files of the benchmarks' answering scripts, read into one form for `gmod answer`
// (docs/eval.md), and the answer record each script writes back: LLaVA's model_vqa_loader jsonl
// (question_id, image, text), model_vqa_science's ScienceQA json list (id, image, conversations),
// model_vqa_mmbench's TSV (base64 images, hint, options), MME's release folder (per-category question files,
// asked as LLaVA's llava_mme.jsonl: eval/mme_release.h) and MMMU's samples (asked as γ-MoD's model_mmmu.py:
// eval/mmmu_questions.h). No LibTorch: images are returned as paths or bytes for the caller to decode.
#pragma once

#include <string>
#include <vector>

#include "eval/records.h"

namespace gmod::eval {

enum class QuestionFormat { kLoader, kScience, kMmbench, kMme, kMmmu };

// The format named on the command line (auto, loader, science, mmbench, mme, mmmu); "auto" decides by the
// path: a folder is MME's release, ".tsv" MMBench, a JSON list ScienceQA, else the loader jsonl (MMMU is
// never guessed). Throws std::invalid_argument for an unknown name.
QuestionFormat question_format(const std::string& name, const std::string& path);
const char* format_name(QuestionFormat f);

struct Question {
  Json id;                  // the id the answer records (question_id, or MMMU's id)
  std::string text;         // what the model is asked (the image goes before it)
  std::string prompt;       // what the answer file records as "prompt" (as the original script writes it)
  std::string image;        // image path relative to the image folder ("" = none, or the bytes below)
  std::string image_bytes;  // MMBench: the decoded base64 image
  Json options;             // MMBench: the options as asked (written with round_id and option_char)
  Json mmmu;                // MMMU: {question_type, answer, all_choices, index2ans} copied to the answer
  std::string where;        // file:line, file[#i] or an MME question file and line
};

// Every usable question of `path` in file order; a record that cannot be read (not JSON, no id, no text, an
// unreadable option list, an MME question file without its image) is added to `problems` by where it is, and
// left out. `single_pred` appends "Answer with the option's letter from the given choices directly." as
// LLaVA's ScienceQA and MMBench runs do. Throws std::runtime_error when the file or folder cannot be read at
// all.
std::vector<Question> read_questions(const std::string& path, QuestionFormat format, bool single_pred,
                                     std::vector<Problem>* problems);

// The answer record the format's original script writes for `q` answered `text` (stripped by the caller):
// model_vqa_loader/science {question_id, prompt, text, answer_id, model_id, metadata}; MMBench adds round_id,
// options, option_char; MMMU's output.json record {id, question_type, answer, all_choices, index2ans,
// response}. A non-empty `problem` (the question could not be asked; `text` is then "") is recorded in
// metadata.problem (MMMU: "problem") so that `gmod score` names the record while scoring it as the original
// scorers score the empty answer it holds (docs/eval.md).
Json answer_record(const Question& q, QuestionFormat format, const std::string& text,
                   const std::string& answer_id, const std::string& model_id,
                   const std::string& problem = "");
// The problem recorded by answer_record, or "" when the record has none.
std::string answer_problem(const Json& record);

// RFC 4648 base64 (and its URL-safe alphabet), whitespace and padding ignored; throws std::invalid_argument
// naming `where` on any other character.
std::string base64_decode(const std::string& in, const std::string& where);

}  // namespace gmod::eval

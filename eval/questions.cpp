// Reading the benchmarks' question files and writing their answer records (see questions.h).
#include "eval/questions.h"

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "eval/mme_release.h"
#include "eval/mmmu_questions.h"
#include "eval/pystr.h"
#include "model/strings.h"

namespace gmod::eval {
namespace {

const char* const kLetterPrompt = "Answer with the option's letter from the given choices directly.";

bool is_json_list(const std::string& path) {
  std::ifstream f(path);
  char c = 0;
  while (f.get(c) && std::isspace(static_cast<unsigned char>(c))) {
  }
  return c == '[';
}

// LLaVA's is_none for a TSV cell: missing (empty), "nan" or "none" in any case.
bool is_none(const std::string* cell) {
  if (!cell || cell->empty()) return true;
  const std::string l = py::lower(*cell);
  return l == "nan" || l == "none";
}

// MMBench's TSV rows as model_vqa_mmbench.py builds them: hint + question + "A. option" lines, options in the
// table's order (one round: the table's circular copies are rows of their own).
void read_mmbench(const std::string& path, bool single_pred, std::vector<Question>* out,
                  std::vector<Problem>* problems) {
  for (const TsvRow& row : read_tsv(path, problems)) {
    const std::string* idx = row.get("index");
    const std::string* question = row.get("question");
    char* end = nullptr;
    const long long index = idx ? std::strtoll(idx->c_str(), &end, 10) : 0;
    if (!idx || idx->empty() || *end || !question) {
      problems->push_back({row.where, "no integer 'index' or no 'question'"});
      continue;
    }
    Question q;
    q.where = row.where;
    q.id = index;
    q.text = is_none(row.get("hint")) ? *question : *row.get("hint") + "\n" + *question;
    q.options = Json::array();
    for (const char* c : {"A", "B", "C", "D"}) {
      const std::string* o = row.get(c);
      if (is_none(o)) break;
      q.text += std::string("\n") + c + ". " + *o;
      q.options.push_back(*o);
    }
    q.prompt = q.text;  // the letter instruction is asked, not recorded
    if (single_pred) q.text += std::string("\n") + kLetterPrompt;
    if (const std::string* img = row.get("image"); img && !img->empty()) {
      try {
        q.image_bytes = base64_decode(*img, row.where);
      } catch (const std::exception& e) {
        problems->push_back({row.where, e.what()});
        continue;
      }
      q.image = "base64";
    }
    out->push_back(std::move(q));
  }
}

// model_vqa_loader's {question_id, image, text}, or (science) model_vqa_science's {id, image, conversations:
// [{value: question}, ...]} whose prompt drops "<image>" and records "<image>\n" + question when there is an
// image; --single-pred-prompt appends the letter instruction to both.
bool read_llava_question(const Record& r, bool science, bool single_pred, Question* q,
                         std::vector<Problem>* problems) {
  const auto id = r.value.find(science ? "id" : "question_id");
  if (id == r.value.end() || id_key(*id).empty()) {
    problems->push_back(
        {r.where, std::string("no '") + (science ? "id" : "question_id") + "' (a string or a number)"});
    return false;
  }
  q->id = *id;
  if (science) {
    const Json& conv = r.value.contains("conversations") ? r.value["conversations"] : Json();
    if (!conv.is_array() || conv.empty() || !conv[0].is_object() || !conv[0].contains("value") ||
        !conv[0]["value"].is_string()) {
      problems->push_back({r.where, "no 'conversations' list whose first turn has a string 'value'"});
      return false;
    }
    q->text = py::strip(py::replace(conv[0]["value"].get<std::string>(), "<image>", ""));
    q->prompt = (r.value.contains("image") ? "<image>\n" : "") + q->text;
  } else {
    const std::string* text = string_field(r, "text", problems);
    if (!text) return false;
    q->text = q->prompt = *text;
  }
  if (single_pred) {
    q->text += std::string("\n") + kLetterPrompt;
    q->prompt += std::string("\n") + kLetterPrompt;
  }
  if (r.value.contains("image")) {
    if (!r.value["image"].is_string()) {
      problems->push_back({r.where, "'image' is not a string"});
      return false;
    }
    q->image = r.value["image"].get<std::string>();
  }
  return true;
}

}  // namespace

QuestionFormat question_format(const std::string& name, const std::string& path) {
  if (name == "loader") return QuestionFormat::kLoader;
  if (name == "science") return QuestionFormat::kScience;
  if (name == "mmbench") return QuestionFormat::kMmbench;
  if (name == "mme") return QuestionFormat::kMme;
  if (name == "mmmu") return QuestionFormat::kMmmu;
  if (name != "auto") throw std::invalid_argument("unknown question format '" + name + "'");
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return QuestionFormat::kMme;
  if (ends_with(path, ".tsv")) return QuestionFormat::kMmbench;
  return is_json_list(path) ? QuestionFormat::kScience : QuestionFormat::kLoader;
}

const char* format_name(QuestionFormat f) {
  switch (f) {
    case QuestionFormat::kLoader:
      return "loader";
    case QuestionFormat::kScience:
      return "science";
    case QuestionFormat::kMmbench:
      return "mmbench";
    case QuestionFormat::kMme:
      return "mme";
    case QuestionFormat::kMmmu:
      return "mmmu";
  }
  return "?";
}

std::vector<Question> read_questions(const std::string& path, QuestionFormat format, bool single_pred,
                                     std::vector<Problem>* problems) {
  std::vector<Question> out;
  if (format == QuestionFormat::kMmbench) {
    read_mmbench(path, single_pred, &out, problems);
    return out;
  }
  if (format == QuestionFormat::kMme) {
    for (const MmeQuestion& m : read_mme_release(path, problems)) {
      Question q;
      q.id = q.image = m.image;
      q.text = q.prompt = mme_llava_text(m.question);
      q.where = m.where;
      out.push_back(std::move(q));
    }
    return out;
  }
  if (format == QuestionFormat::kMmmu) {
    for (const Record& r : read_records(path, problems)) {
      MmmuQuestion m;
      if (!read_mmmu_question(r, &m, problems)) continue;
      Question q;
      q.id = m.id;
      q.text = q.prompt = m.text;
      q.image = m.image;
      q.mmmu = m.fields;
      q.where = m.where;
      out.push_back(std::move(q));
    }
    return out;
  }
  for (const Record& r : read_records(path, problems)) {
    Question q;
    q.where = r.where;
    if (read_llava_question(r, format == QuestionFormat::kScience, single_pred, &q, problems))
      out.push_back(std::move(q));
  }
  return out;
}

Json answer_record(const Question& q, QuestionFormat format, const std::string& text,
                   const std::string& answer_id, const std::string& model_id, const std::string& problem) {
  if (format == QuestionFormat::kMmmu) {
    Json rec = {{"id", q.id}, {"question_type", q.mmmu["question_type"]}, {"answer", q.mmmu["answer"]}};
    if (q.mmmu.contains("all_choices")) rec["all_choices"] = q.mmmu["all_choices"];
    if (q.mmmu.contains("index2ans")) rec["index2ans"] = q.mmmu["index2ans"];
    rec["response"] = text;
    if (!problem.empty()) rec["problem"] = problem;
    return rec;
  }
  Json rec = {{"question_id", q.id}};
  const bool mmbench = format == QuestionFormat::kMmbench;
  if (mmbench) rec["round_id"] = 0;
  rec["prompt"] = q.prompt;
  rec["text"] = text;
  if (mmbench) {
    rec["options"] = q.options;
    rec["option_char"] = Json::array();
    for (size_t k = 0; k < q.options.size(); ++k) rec["option_char"].push_back(std::string(1, "ABCD"[k]));
  }
  rec["answer_id"] = answer_id;
  rec["model_id"] = model_id;
  rec["metadata"] = Json::object();
  if (!problem.empty()) rec["metadata"]["problem"] = problem;
  return rec;
}

std::string answer_problem(const Json& record) {
  if (!record.is_object()) return "";
  if (record.contains("problem") && record["problem"].is_string())
    return record["problem"].get<std::string>();
  if (record.contains("metadata") && record["metadata"].is_object() &&
      record["metadata"].contains("problem") && record["metadata"]["problem"].is_string())
    return record["metadata"]["problem"].get<std::string>();
  return "";
}

std::string base64_decode(const std::string& in, const std::string& where) {
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z')
      v = c - 'A';
    else if (c >= 'a' && c <= 'z')
      v = c - 'a' + 26;
    else if (c >= '0' && c <= '9')
      v = c - '0' + 52;
    else if (c == '+' || c == '-')
      v = 62;
    else if (c == '/' || c == '_')
      v = 63;
    else if (c == '=' || std::isspace(static_cast<unsigned char>(c)))
      continue;
    else
      throw std::invalid_argument(where + ": the image is not base64");
    acc = (acc << 6) | static_cast<uint32_t>(v), bits += 6;
    if (bits >= 8) bits -= 8, out += static_cast<char>((acc >> bits) & 0xFF);
  }
  return out;
}

}  // namespace gmod::eval

// MME's release folder as questions, and an answer's way back to its question (see mme_release.h).
#include "eval/mme_release.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>

#include "eval/pystr.h"

namespace gmod::eval {
namespace {

namespace fs = std::filesystem;

const char* const kYesNo = "Please answer yes or no.";
const char* const kShort = "Answer the question using a single word or phrase.";

std::vector<std::string> sorted_entries(const fs::path& dir, bool dirs) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (dirs ? e.is_directory() : e.is_regular_file()) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

bool is_image_name(const std::string& name) {
  const std::string ext = py::lower(fs::path(name).extension().string());
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png" || ext == ".bmp" || ext == ".gif" || ext == ".webp";
}

}  // namespace

std::vector<MmeQuestion> read_mme_release(const std::string& dir, std::vector<Problem>* problems) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw std::runtime_error(dir + ": not a folder (MME's release folder, MME_Benchmark_release_version)");
  std::vector<MmeQuestion> out;
  for (const std::string& cat : sorted_entries(dir, true)) {
    const fs::path cat_dir = fs::path(dir) / cat;
    const bool split = fs::is_directory(cat_dir / "images");
    const fs::path image_dir = split ? cat_dir / "images" : cat_dir;
    const fs::path qa_dir = split ? cat_dir / "questions_answers_YN" : cat_dir;
    if (!fs::is_directory(qa_dir)) {
      problems->push_back({cat_dir.string(), "has images/ but no questions_answers_YN/"});
      continue;
    }
    std::map<std::string, std::string> image_of;  // stem -> file name
    for (const std::string& f : sorted_entries(image_dir, false))
      if (is_image_name(f)) image_of.emplace(fs::path(f).stem().string(), f);
    const std::string rel_images = split ? cat + "/images/" : cat + "/";
    for (const std::string& f : sorted_entries(qa_dir, false)) {
      if (fs::path(f).extension() != ".txt") continue;
      const std::string path = (qa_dir / f).string();
      const auto img = image_of.find(fs::path(f).stem().string());
      if (img == image_of.end()) {
        problems->push_back(
            {path, "no image named " + fs::path(f).stem().string() + ".* in " + image_dir.string()});
        continue;
      }
      std::ifstream in(path, std::ios::binary);
      if (!in) throw std::runtime_error(path + ": cannot open for reading");
      std::string line;
      for (int n = 1; std::getline(in, line); ++n) {
        const std::string where = path + ":" + std::to_string(n);
        // convert_answer_to_mme.py: line.strip().split('\t') must give exactly two fields
        const std::vector<std::string> parts = py::split(py::strip(line), "\t");
        if (parts.size() != 2) {
          problems->push_back({where, "not \"question<TAB>answer\" (" + std::to_string(parts.size()) +
                                          " tab-separated fields)"});
          continue;
        }
        out.push_back({cat, rel_images + img->second, f, parts[0], parts[1], where});
      }
    }
  }
  return out;
}

std::string mme_llava_text(const std::string& question) {
  return py::strip(py::replace(question, kYesNo, "")) + "\n" + kShort;
}

std::pair<std::string, std::string> mme_answer_file(const std::string& question_id) {
  const std::vector<std::string> parts = py::split(question_id, "/");
  return {parts.front(), py::split(parts.back(), ".").front() + ".txt"};
}

std::vector<std::string> mme_released_questions(const std::string& prompt) {
  std::string p = prompt;
  if (p.find(kShort) != std::string::npos) p = py::strip(py::replace(p, kShort, ""));
  if (p.find(kYesNo) != std::string::npos) return {p};
  return {p + " " + kYesNo, p + "  " + kYesNo};
}

}  // namespace gmod::eval

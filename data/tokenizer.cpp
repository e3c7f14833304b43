// load_tokenizer: picks the SentencePiece or byte-level BPE implementation for a file or model directory.
#include "data/tokenizer.h"

#include <sys/stat.h>

#include <cctype>
#include <fstream>
#include <stdexcept>

#include "data/bpe_tokenizer.h"
#include "data/sentencepiece_tokenizer.h"

namespace gmod {
namespace {

// POSIX stat rather than std::filesystem: libtorch.so exports its own std::filesystem symbols, and some of them
// (remove_all) crash when they interpose on a binary's; keep data/ independent of that.
bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool is_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}
std::string extension(const std::string& p) {
  const size_t slash = p.find_last_of('/'), dot = p.find_last_of('.');
  return dot == std::string::npos || (slash != std::string::npos && dot < slash) ? "" : p.substr(dot);
}

bool looks_like_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char c = 0;
  while (in.get(c))
    if (!std::isspace(static_cast<unsigned char>(c))) return c == '{';
  return false;
}

}  // namespace

// Directory: tokenizer.json if it is a supported byte-level BPE; otherwise tokenizer.model (a LLaMA-2 repo often
// ships both, and its Metaspace tokenizer.json is not byte-level, so the SentencePiece model is the right choice).
// File: *.json -> BPE, *.model -> SentencePiece, anything else by content ('{' first -> JSON).
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  if (is_dir(path)) {
    const std::string base = path.back() == '/' ? path : path + "/";
    const std::string json = base + "tokenizer.json", model = base + "tokenizer.model";
    const bool has_json = is_file(json), has_model = is_file(model);
    if (has_json) {
      try {
        return std::make_unique<BpeTokenizer>(json);
      } catch (const UnsupportedTokenizerError&) {
        if (!has_model) throw;
      }
    }
    if (has_model) return std::make_unique<SentencePieceTokenizer>(model);
    throw std::runtime_error("load_tokenizer: directory '" + path +
                             "' has neither tokenizer.json nor tokenizer.model");
  }
  if (!is_file(path)) throw std::runtime_error("load_tokenizer: '" + path + "' does not exist");
  const std::string ext = extension(path);
  if (ext == ".json" || (ext != ".model" && looks_like_json(path))) return std::make_unique<BpeTokenizer>(path);
  return std::make_unique<SentencePieceTokenizer>(path);
}

}  // namespace gmod

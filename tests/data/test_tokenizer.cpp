// Tokenizers against Python oracles (tests/fixtures/tokenizer/cases.json from make_tokenizer_fixtures.py),
// plus load_tokenizer's file/directory selection and its error messages.
#include <ftw.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "data/bpe_tokenizer.h"
#include "data/sentencepiece_tokenizer.h"
#include "data/tokenizer.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

fs::path fixture_dir() {
  const char* env = std::getenv("GMOD_SOURCE_DIR");
  const fs::path root = env && *env ? fs::path(env) : fs::path(__FILE__).parent_path().parent_path().parent_path();
  return root / "tests" / "fixtures" / "tokenizer";
}

const json& cases() {
  static const json j = [] {
    std::ifstream in(fixture_dir() / "cases.json");
    if (!in) throw std::runtime_error("missing " + (fixture_dir() / "cases.json").string());
    return json::parse(in);
  }();
  return j;
}

std::vector<int32_t> ids_of(const json& a) { return a.get<std::vector<int32_t>>(); }

std::optional<int32_t> opt_of(const json& v) {
  return v.is_null() ? std::nullopt : std::optional<int32_t>(v.get<int32_t>());
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("gmod_tok_" + std::to_string(::getpid()) + "_" +
            std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    fs::create_directories(path);
  }
  // Not fs::remove_all: the copy exported by libtorch.so (linked into this binary) crashes.
  ~TempDir() {
    ::nftw(path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
           FTW_DEPTH | FTW_PHYS);
  }
  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
    return path / name;
  }
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no exception>";
}

// Encodes every fixture string with both parse_special settings and decodes; returns the number fully matched.
int check_all_cases(const gmod::Tokenizer& tok, const std::string& name) {
  const json& t = cases().at(name);
  int matched = 0;
  for (const json& c : t.at("cases")) {
    const std::string text = c.at("text").get<std::string>();
    SCOPED_TRACE(name + ": text " + json(text).dump());
    const auto ids = tok.encode(text, true);
    const auto ids_ns = tok.encode(text, false);
    const std::string dec = tok.decode(ids);
    EXPECT_EQ(ids, ids_of(c.at("ids")));
    EXPECT_EQ(ids_ns, ids_of(c.at("ids_no_special")));
    EXPECT_EQ(dec, c.at("decoded").get<std::string>());
    matched += ids == ids_of(c.at("ids")) && ids_ns == ids_of(c.at("ids_no_special")) &&
               dec == c.at("decoded").get<std::string>();
  }
  std::printf("[ tokenizer ] %-6s %d / %zu fixture strings match Python\n", name.c_str(), matched,
              t.at("cases").size());
  return matched;
}

class FixtureTokenizer : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureTokenizer, MatchesPythonIdsAndDecode) {
  const std::string name = GetParam();
  const json& t = cases().at(name);
  const fs::path file = fixture_dir() / t.at("path").get<std::string>();
  // Both the file itself and its directory.
  for (const fs::path& p : {file, file.parent_path()}) {
    SCOPED_TRACE(p.string());
    const auto tok = gmod::load_tokenizer(p.string());
    EXPECT_EQ(tok->vocab_size(), t.at("vocab_size").get<int32_t>());
    EXPECT_EQ(tok->bos_id(), opt_of(t.at("bos")));
    EXPECT_EQ(tok->eos_id(), opt_of(t.at("eos")));
    EXPECT_EQ(tok->pad_id(), opt_of(t.at("pad")));
    EXPECT_EQ(tok->unk_id(), opt_of(t.at("unk")));
    EXPECT_EQ(check_all_cases(*tok, name), static_cast<int>(t.at("cases").size()));
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, FixtureTokenizer, ::testing::Values("sp", "gpt2", "llama3", "smol"));

TEST(Tokenizer, DecodeRoundTripsPlainText) {
  for (const char* name : {"sp", "gpt2", "llama3"}) {  // not smol: add_prefix_space adds a leading space
    const auto tok = gmod::load_tokenizer((fixture_dir() / name).string());
    for (const std::string s : {"Hello world", "line1\nline2\r\n  x", "Café 中文 👍🏽 🧑\u200d🚀", "12 345 6789",
                                "A chat.</s>USER: hi ASSISTANT: yo</s>"}) {
      EXPECT_EQ(tok->decode(tok->encode(s)), s) << name;
    }
  }
}

TEST(Tokenizer, SentencePieceLlavaSpecials) {
  const auto tok = gmod::load_tokenizer((fixture_dir() / "sp" / "tokenizer.model").string());
  EXPECT_EQ(tok->token_to_id("</s>"), 2);
  EXPECT_EQ(tok->token_to_id("<s>"), 1);
  EXPECT_EQ(tok->token_to_id("<unk>"), 0);
  EXPECT_EQ(tok->token_to_id("no-such-piece-xyz"), std::nullopt);
  // "</s>" is one id in a prompt; the following chunk starts afresh with the dummy prefix (LLaVA's round lengths).
  const auto round = tok->encode("USER: hi ASSISTANT: yo");
  const auto two = tok->encode("A</s>USER: hi ASSISTANT: yo");
  ASSERT_GE(two.size(), round.size() + 1);
  EXPECT_EQ(std::vector<int32_t>(two.end() - round.size(), two.end()), round);
  EXPECT_EQ(two[two.size() - round.size() - 1], 2);
  EXPECT_THROW(tok->decode({tok->vocab_size()}), std::out_of_range);
}

TEST(Tokenizer, BpeSpecialsAndIds) {
  const auto tok = gmod::load_tokenizer((fixture_dir() / "llama3").string());
  const auto start = tok->token_to_id("<|im_start|>"), end = tok->token_to_id("<|im_end|>");
  ASSERT_TRUE(start && end);
  EXPECT_EQ(tok->encode("<|im_start|><|im_end|>"), (std::vector<int32_t>{*start, *end}));
  EXPECT_GT(tok->encode("<|im_start|>", false).size(), 1u);
  auto* bpe = dynamic_cast<gmod::BpeTokenizer*>(tok.get());
  ASSERT_NE(bpe, nullptr);
  EXPECT_TRUE(bpe->is_special(*start));
  EXPECT_EQ(bpe->id_to_token(*start), std::optional<std::string>("<|im_start|>"));
  EXPECT_EQ(bpe->id_to_token(-1), std::nullopt);
  EXPECT_THROW(tok->decode({tok->vocab_size() + 5}), std::out_of_range);
  // Invalid UTF-8 is replaced (like Python's errors="replace") rather than thrown.
  EXPECT_EQ(tok->encode("a\xff" "b"), tok->encode("a\xEF\xBF\xBD" "b"));
}

TEST(Tokenizer, BpeConcurrentAndLongInputs) {
  const auto tok = gmod::load_tokenizer((fixture_dir() / "gpt2").string());
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "The picture " + std::to_string(i) + " shows a cat, 👍 naïve.\n";
  text += std::string(200000, 'a') + " " + std::string(50000, ' ') + "x";  // one huge word and a whitespace run
  const auto t0 = std::chrono::steady_clock::now();
  const auto ref = tok->encode(text);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ tokenizer ] gpt2: %.2f MB in %.3f s (%zu ids)\n", text.size() / 1e6, secs, ref.size());
  EXPECT_LT(secs, 20.0);
  EXPECT_EQ(tok->decode(ref), text);
  std::vector<std::thread> th;
  std::vector<int> ok(4, 0);
  for (int k = 0; k < 4; ++k)
    th.emplace_back([&, k] { ok[k] = tok->encode(text.substr(0, 400000)) == tok->encode(text.substr(0, 400000)); });
  for (auto& t : th) t.join();
  for (int k = 0; k < 4; ++k) EXPECT_TRUE(ok[k]);
}

TEST(Tokenizer, ErrorsNameThePath) {
  TempDir d;
  const std::string missing = (d.path / "nope" / "tokenizer.json").string();
  EXPECT_NE(error_of([&] { gmod::load_tokenizer(missing); }).find(missing), std::string::npos);

  const fs::path bad = d.write("bad.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {");
  const std::string e1 = error_of([&] { gmod::load_tokenizer(bad.string()); });
  EXPECT_NE(e1.find(bad.string()), std::string::npos) << e1;
  EXPECT_NE(e1.find("malformed JSON"), std::string::npos) << e1;

  const fs::path wp = d.write("wp.json", R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}})");
  const std::string e2 = error_of([&] { gmod::load_tokenizer(wp.string()); });
  EXPECT_NE(e2.find(wp.string()), std::string::npos) << e2;
  EXPECT_NE(e2.find("WordPiece"), std::string::npos) << e2;
  EXPECT_THROW(gmod::load_tokenizer(wp.string()), gmod::UnsupportedTokenizerError);

  const fs::path garbage = d.write("x.model", "this is not a protobuf");
  const std::string e3 = error_of([&] { gmod::load_tokenizer(garbage.string()); });
  EXPECT_NE(e3.find(garbage.string()), std::string::npos) << e3;

  fs::create_directories(d.path / "empty");
  const std::string e4 = error_of([&] { gmod::load_tokenizer((d.path / "empty").string()); });
  EXPECT_NE(e4.find((d.path / "empty").string()), std::string::npos) << e4;

  // A merge naming a token that is not in the vocab.
  json j = json::parse(slurp(fixture_dir() / "gpt2" / "tokenizer.json"));
  j["model"]["merges"].push_back("zzzq qqqz");
  const fs::path bm = d.write("badmerge.json", j.dump());
  const std::string e5 = error_of([&] { gmod::load_tokenizer(bm.string()); });
  EXPECT_NE(e5.find(bm.string()), std::string::npos) << e5;
  EXPECT_NE(e5.find("zzzq"), std::string::npos) << e5;
}

TEST(Tokenizer, DirectoryFallsBackToSentencePieceForMetaspaceJson) {
  // A LLaMA-2 repository ships a SentencePiece-style (Metaspace) tokenizer.json next to tokenizer.model.
  TempDir d;
  d.write("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
    "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581"}})");
  const std::string e = error_of([&] { gmod::load_tokenizer((d.path / "tokenizer.json").string()); });
  EXPECT_NE(e.find("Metaspace"), std::string::npos) << e;
  fs::copy_file(fixture_dir() / "sp" / "tokenizer.model", d.path / "tokenizer.model");
  const auto tok = gmod::load_tokenizer(d.path.string());
  EXPECT_NE(dynamic_cast<gmod::SentencePieceTokenizer*>(tok.get()), nullptr);
}

}  // namespace

// RecordFile: streaming index of JSON lists and JSONL, the on-disk index cache and its invalidation, and
// errors that name the file, the record index and the id.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "data/records.h"
#include "tests/common/paths.h"

namespace fs = std::filesystem;
using gmod::IndexSource;
using gmod::RecordError;
using gmod::RecordFile;

namespace {

const std::vector<std::string> kRecords = {
    R"({"id": "a", "image": "x/1.png", "conversations": [{"from": "human", "value": "<image>\nWhat {is} [this]?"},
        {"from": "gpt", "value": "A \"quoted\" } brace \\ and ] bracket"}]})",
    R"({"id": 17, "conversations": [{"from": "human", "value": "Caf\u00e9 \ud83d\udc4d"}, {"from": "gpt", "value": "ok"}]})",
    R"({"id": "c", "image": ["p.png", "q.png"], "conversations": [{"from": "human", "value": "<image> <image>"},
        {"from": "gpt", "value": "two"}]})",
};

void write(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

std::string as_list(const std::vector<std::string>& recs) {
  std::string s = "\xEF\xBB\xBF[\n  ";
  for (size_t i = 0; i < recs.size(); ++i) s += (i ? ",\n  " : "") + recs[i];
  return s + "\n]\n";
}

std::string as_jsonl(const std::vector<std::string>& recs) {
  std::string s;
  for (const auto& r : recs) {
    std::string line = r;
    for (auto& c : line)
      if (c == '\n') c = ' ';
    s += line + "\n";
  }
  return s;
}

}  // namespace

TEST(Records, JsonListAndJsonlGiveTheSameRecords) {
  gmod::test::TempDir dir;
  write(dir.str("d.json"), as_list(kRecords));
  write(dir.str("d.jsonl"), as_jsonl(kRecords));
  RecordFile list(dir.str("d.json")), lines(dir.str("d.jsonl"));
  EXPECT_FALSE(list.is_jsonl());
  EXPECT_TRUE(lines.is_jsonl());
  ASSERT_EQ(list.size(), 3u);
  ASSERT_EQ(lines.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    auto a = list.get(i), b = lines.get(i);
    EXPECT_EQ(a.id, b.id);
    EXPECT_EQ(a.images, b.images);
    ASSERT_EQ(a.conversations.size(), b.conversations.size());
    for (size_t t = 0; t < a.conversations.size(); ++t) {
      EXPECT_EQ(a.conversations[t].from, b.conversations[t].from);
      EXPECT_EQ(a.conversations[t].value, b.conversations[t].value);
    }
  }
  auto r0 = list.get(0);
  EXPECT_EQ(r0.conversations[1].value, "A \"quoted\" } brace \\ and ] bracket");
  EXPECT_EQ(list.get(1).id, "17");
  EXPECT_EQ(list.get(1).conversations[0].value, "Caf\xC3\xA9 \xF0\x9F\x91\x8D");
  EXPECT_EQ(list.get(2).images, (std::vector<std::string>{"p.png", "q.png"}));
  EXPECT_TRUE(list.get(1).images.empty());
}

TEST(Records, IndexIsCachedAndRebuiltWhenTheFileChanges) {
  gmod::test::TempDir dir;
  const std::string path = dir.str("d.json");
  write(path, as_list(kRecords));
  {
    RecordFile f(path);
    EXPECT_EQ(f.index_source(), IndexSource::kScanned);
    EXPECT_TRUE(f.cache_written());
    EXPECT_TRUE(fs::exists(RecordFile::cache_path(path)));
  }
  {
    RecordFile f(path);
    EXPECT_EQ(f.index_source(), IndexSource::kCache);
    EXPECT_EQ(f.size(), 3u);
    EXPECT_EQ(f.get(2).id, "c");
  }
  // touch: same bytes, new mtime -> rescanned
  fs::last_write_time(path, fs::last_write_time(path) + std::chrono::seconds(5));
  {
    RecordFile f(path);
    EXPECT_EQ(f.index_source(), IndexSource::kScanned);
  }
  EXPECT_EQ(RecordFile(path).index_source(), IndexSource::kCache);
  // rewritten with the same size and the old mtime restored: the content hash catches it
  const auto mtime = fs::last_write_time(path);
  std::string text = as_list(kRecords);
  text.replace(text.find("\"a\""), 3, "\"b\"");
  write(path, text);
  fs::last_write_time(path, mtime);
  {
    RecordFile f(path);
    EXPECT_EQ(f.index_source(), IndexSource::kScanned);
    EXPECT_EQ(f.get(0).id, "b");
  }
  // a shorter file: different size, and the stale spans are not used
  write(path, as_list({kRecords[0]}));
  fs::last_write_time(path, mtime);
  EXPECT_EQ(RecordFile(path).size(), 1u);
  // use_cache = false neither reads nor writes
  EXPECT_EQ(RecordFile(path, false).index_source(), IndexSource::kScanned);
}

TEST(Records, UnwritableDirectoryKeepsTheIndexInMemory) {
  gmod::test::TempDir dir;
  const std::string path = dir.str("d.jsonl");
  write(path, as_jsonl(kRecords));
  fs::create_directory(RecordFile::cache_path(path));  // a directory where the cache file should go
  RecordFile f(path);
  EXPECT_FALSE(f.cache_written());
  EXPECT_EQ(f.size(), 3u);
  EXPECT_EQ(RecordFile(path).index_source(), IndexSource::kScanned);
}

TEST(Records, InvalidRecordsNameFileIndexAndId) {
  gmod::test::TempDir dir;
  const std::string path = dir.str("bad.json");
  write(path, as_list({
                  kRecords[0],
                  R"({"id": "no-conv", "image": "a.png"})",
                  R"({"id": "role", "conversations": [{"from": "system", "value": "hi"}]})",
                  R"({"id": "badjson", "conversations": [tru]})",
                  R"({"id": "valtype", "conversations": [{"from": "human", "value": 3}]})",
                  R"({"id": "empty", "conversations": []})",
                  R"({"id": "imgtype", "image": 5, "conversations": [{"from": "human", "value": "x"}]})",
              }));
  RecordFile f(path);
  ASSERT_EQ(f.size(), 7u);
  EXPECT_NO_THROW(f.get(0));
  auto expect_error = [&](size_t i, const std::string& id, const std::string& what) {
    try {
      f.get(i);
      ADD_FAILURE() << "record " << i << " did not throw";
    } catch (const RecordError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find("record " + std::to_string(i)), std::string::npos) << msg;
      if (!id.empty()) {
        EXPECT_NE(msg.find("'" + id + "'"), std::string::npos) << msg;
      }
      EXPECT_EQ(e.id(), id);
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
    }
  };
  expect_error(1, "no-conv", "missing \"conversations\"");
  expect_error(2, "role", "\"human\" or \"gpt\"");
  expect_error(3, "badjson", "malformed JSON");
  expect_error(4, "valtype", "\"value\"");
  expect_error(5, "empty", "empty");
  expect_error(6, "imgtype", "\"image\"");
  EXPECT_THROW(f.get(7), std::out_of_range);
}

TEST(Records, BrokenFileStructureIsRejectedWithTheFileName) {
  gmod::test::TempDir dir;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[{\"id\": \"a\"}", "missing closing"},
      {"[{\"id\": \"a\"}, 3]", "expected a record object"},
      {"[{\"id\": \"a\"} {\"id\": \"b\"}]", "missing ','"},
      {"{\"id\": \"a\", \"x\": \"unterminated}\n", "unterminated"},
      {"[{\"id\": \"a\"}] x", "after the closing"},
      {"  ", "empty"},
      {"\"text\"", "expected '[' or '{'"},
  };
  for (const auto& [text, what] : cases) {
    const std::string path = dir.str("s.json");
    write(path, text);
    try {
      RecordFile f(path, false);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(RecordFile(dir.str("missing.json")), std::runtime_error);
  write(dir.str("empty_list.json"), "[ ]");
  EXPECT_EQ(RecordFile(dir.str("empty_list.json")).size(), 0u);
}

TEST(Records, IndexingIsStreamingAcrossBlockBoundaries) {
  // Records larger than the 4 MiB scan block, with strings straddling block edges.
  gmod::test::TempDir dir;
  std::string big(5 << 20, 'x');
  big[1 << 20] = '{';
  big[3 << 20] = ']';
  std::vector<std::string> recs;
  for (int i = 0; i < 3; ++i)
    recs.push_back("{\"id\": \"r" + std::to_string(i) +
                   "\", \"conversations\": [{\"from\": \"human\", \"value\": \"" + big + "\\\"\"}]}");
  write(dir.str("big.jsonl"), as_jsonl(recs));
  RecordFile f(dir.str("big.jsonl"));
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f.get(2).id, "r2");
  EXPECT_EQ(f.get(1).conversations[0].value.size(), big.size() + 1);
}

// Issue 45: LLaVA records with an image list and a "video" key, and the ShareGPT layout (messages, images, videos).
TEST(Records, ShareGptLayoutAndVideoKeys) {
  const auto llava = gmod::parse_record(
      R"({"id": "v", "image": ["a.png", "b.jpg"], "video": "clips/c.mp4", "conversations": [
          {"from": "human", "value": "<image><image><video> compare"}, {"from": "gpt", "value": "same"}]})",
      "x.json: record 0");
  EXPECT_EQ(llava.images, (std::vector<std::string>{"a.png", "b.jpg"}));
  EXPECT_EQ(llava.videos, (std::vector<std::string>{"clips/c.mp4"}));
  ASSERT_EQ(llava.conversations.size(), 2u);

  const auto share = gmod::parse_record(
      R"({"id": 4, "messages": [{"role": "user", "content": "<video>What happens?"},
          {"role": "assistant", "content": "A ball rolls."}, {"role": "user", "content": "<image>And here?"},
          {"role": "assistant", "content": "Nothing."}], "images": ["p.png"], "videos": ["v1.mp4", "v2.mkv"]})",
      "x.json: record 1");
  EXPECT_EQ(share.id, "4");
  EXPECT_EQ(share.images, (std::vector<std::string>{"p.png"}));
  EXPECT_EQ(share.videos, (std::vector<std::string>{"v1.mp4", "v2.mkv"}));
  ASSERT_EQ(share.conversations.size(), 4u);
  EXPECT_EQ(share.conversations[0].from, "human");
  EXPECT_EQ(share.conversations[0].value, "<video>What happens?");
  EXPECT_EQ(share.conversations[1].from, "gpt");
  EXPECT_EQ(share.conversations[3].value, "Nothing.");
  // A ShareGPT record without media is a text-only record.
  const auto text = gmod::parse_record(
      R"({"id": "t", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})",
      "x");
  EXPECT_TRUE(text.images.empty());
  EXPECT_TRUE(text.videos.empty());

  const auto expect_error = [](const std::string& json, const std::string& what) {
    try {
      gmod::parse_record(json, "bad.json: record 9");
      ADD_FAILURE() << "no error for " << json;
    } catch (const RecordError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("bad.json: record 9 (id 'b')"), std::string::npos) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
    }
  };
  const std::string turns = R"([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])";
  const std::string llava_turns = R"([{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}])";
  expect_error(R"({"id": "b", "messages": )" + turns + R"(, "conversations": )" + llava_turns + "}", "both");
  expect_error(R"({"id": "b", "messages": )" + turns + R"(, "image": "x.png"})", "\"image\" does not belong");
  expect_error(R"({"id": "b", "conversations": )" + llava_turns + R"(, "videos": ["x.mp4"]})", "use \"video\"");
  expect_error(R"({"id": "b", "messages": [{"role": "system", "content": "be brief"}]})", "system prompt");
  expect_error(R"({"id": "b", "messages": [{"role": "user", "content": [{"type": "text"}]}]})", "\"content\"");
  expect_error(R"({"id": "b", "messages": [{"from": "human", "value": "q"}]})", "missing string \"role\"");
  expect_error(R"({"id": "b", "messages": {}})", "\"messages\" must be a list");
  expect_error(R"({"id": "b", "messages": []})", "\"messages\" is empty");
  expect_error(R"({"id": "b", "messages": )" + turns + R"(, "videos": [3]})", "\"videos\" list must hold strings");
  expect_error(R"({"id": "b", "conversations": )" + llava_turns + R"(, "video": ""})", "empty path in \"video\"");
  expect_error(R"({"id": "b", "video": "x.mp4"})", "missing \"conversations\"");
}

// LLaVA-format instruction records (a JSON list or JSONL) read lazily: one streaming scan finds the byte
// range of every top-level record object (no full parse), the index is cached next to the file as
// `<file>.gmodidx`, and single records are parsed on demand with pread. A record has one of two layouts:
//   LLaVA:    {"id": str|int, "image": str | [str, ...] (optional), "video": str | [str, ...] (optional),
//              "conversations": [{"from": "human"|"gpt", "value": str}]}
//   ShareGPT: {"id": str|int, "images": str | [str, ...] (optional), "videos": str | [str, ...] (optional),
//              "messages": [{"role": "user"|"assistant", "content": str}]}
// ShareGPT messages become the same turns ("user" -> "human", "assistant" -> "gpt"); a "system" message is refused
// (the conversation template gives the system prompt). The other layout's media keys are refused, not ignored.
// Thread-safe: get() may be called from several threads at once.
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace gmod {

struct Turn {
  std::string from;  // "human" or "gpt"
  std::string value;
};

struct Record {
  std::string id;                   // as written; numeric ids are printed in decimal
  std::vector<std::string> images;  // relative image paths; empty for text-only records
  std::vector<std::string> videos;  // relative video paths (issue 45; data/video_prep.h, Qwen2.5-VL only)
  std::vector<Turn> conversations;
};

// A record that is not valid (malformed JSON, missing/ill-typed fields, wrong roles). The message names the
// file, the record index and (when readable) the id.
class RecordError : public std::runtime_error {
 public:
  RecordError(const std::string& what, std::string id) : std::runtime_error(what), id_(std::move(id)) {}
  const std::string& id() const { return id_; }

 private:
  std::string id_;
};

// Byte range of one top-level record object inside the file.
struct RecordSpan {
  uint64_t offset = 0;
  uint64_t length = 0;
};

enum class IndexSource { kScanned, kCache };

class RecordFile {
 public:
  // Opens `path` and loads or builds its index. `use_cache` = false never reads or writes `<path>.gmodidx`.
  // Throws std::runtime_error naming the file (unreadable, not a JSON list or JSONL of objects, unbalanced
  // brackets, stray text between records).
  explicit RecordFile(const std::string& path, bool use_cache = true);
  ~RecordFile();
  RecordFile(const RecordFile&) = delete;
  RecordFile& operator=(const RecordFile&) = delete;

  size_t size() const { return spans_.size(); }
  // Parses record `i`. Throws RecordError (file, index, id, reason) on invalid content, std::out_of_range on
  // i.
  Record get(size_t i) const;
  // The raw JSON text of record `i`.
  std::string raw(size_t i) const;
  // `len` bytes of the file from `offset` (e.g. a run of records' spans at once); throws naming the file on a
  // short read.
  void read_bytes(uint64_t offset, char* dst, uint64_t len) const;

  const std::string& path() const { return path_; }
  bool is_jsonl() const { return jsonl_; }
  // Whether the index came from the cache file or from a fresh scan, and whether a cache was written.
  IndexSource index_source() const { return source_; }
  bool cache_written() const { return cache_written_; }
  const std::vector<RecordSpan>& spans() const { return spans_; }

  // Where the index of `path` is cached.
  static std::string cache_path(const std::string& path) { return path + ".gmodidx"; }

  // Per-record integers derived by parsing the records (Dataset's modality lengths), cached as
  // `<file>.gmodidx.<tag>` under the index's key (file size, mtime, content hash), so they are invalidated with it.
  // load_derived fills `out` and returns true when such a cache exists, matches the file and holds one value per
  // record; write_derived writes it atomically (temporary name + rename; an unwritable directory is no error).
  // Neither touches the disk when the RecordFile was opened with use_cache = false.
  bool load_derived(const std::string& tag, std::vector<int64_t>& out) const;
  bool write_derived(const std::string& tag, const std::vector<int64_t>& values) const;

 private:
  void scan();
  // What every cache file beside the index is keyed by: the data file's size, mtime (ns) and content hash.
  std::array<uint64_t, 3> cache_key() const {
    return {file_size_, static_cast<uint64_t>(mtime_ns_), content_hash_};
  }
  bool load_cache();
  void write_cache();

  std::string path_;
  int fd_ = -1;
  uint64_t file_size_ = 0;
  int64_t mtime_ns_ = 0;
  uint64_t content_hash_ = 0;
  bool jsonl_ = false;
  IndexSource source_ = IndexSource::kScanned;
  bool cache_written_ = false;
  bool use_cache_ = true;
  std::vector<RecordSpan> spans_;
};

// Parses and validates one record object; `where` prefixes error messages (e.g. "data.json: record 12").
Record parse_record(const std::string& json_text, const std::string& where);

}  // namespace gmod

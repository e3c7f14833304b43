// Streaming record index, its on-disk cache, and single-record parsing.
#include "data/records.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

namespace gmod {
namespace {

constexpr char kMagic[8] = {'G', 'M', 'O', 'D', 'I', 'D', 'X', '1'};
constexpr uint64_t kHashWindow = 64 * 1024;

std::string sys_error(const std::string& what, const std::string& path) {
  return path + ": " + what + ": " + std::strerror(errno);
}

void pread_all(int fd, char* dst, uint64_t len, uint64_t off, const std::string& path) {
  while (len > 0) {
    ssize_t n = ::pread(fd, dst, len, static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(sys_error("read failed", path));
    }
    if (n == 0) throw std::runtime_error(path + ": unexpected end of file (file changed while reading?)");
    dst += n;
    len -= static_cast<uint64_t>(n);
    off += static_cast<uint64_t>(n);
  }
}

uint64_t fnv1a(const char* p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 0x100000001b3ULL;
  }
  return h;
}

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::string describe_char(char c) {
  if (static_cast<unsigned char>(c) >= 32 && c != 127) return std::string("'") + c + "'";
  return "byte " + std::to_string(static_cast<unsigned char>(c));
}

// Best-effort id of a record whose JSON does not parse, for the error message: the first "id": "..." or "id":
// 123.
std::string guess_id(const std::string& text) {
  const size_t k = text.find("\"id\"");
  if (k == std::string::npos) return "";
  size_t p = text.find_first_not_of(" \t\r\n", k + 4);
  if (p == std::string::npos || text[p] != ':') return "";
  p = text.find_first_not_of(" \t\r\n", p + 1);
  if (p == std::string::npos) return "";
  if (text[p] == '"') {
    const size_t e = text.find('"', p + 1);
    if (e == std::string::npos || e - p > 256 || text.find('\\', p + 1) < e) return "";
    return text.substr(p + 1, e - p - 1);
  }
  const size_t e = text.find_first_not_of("0123456789", p);
  return e > p ? text.substr(p, e - p) : "";
}

}  // namespace

RecordFile::RecordFile(const std::string& path, bool use_cache) : path_(path), use_cache_(use_cache) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw std::runtime_error(sys_error("cannot open record file", path));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    ::close(fd_);
    throw std::runtime_error(sys_error("cannot stat", path));
  }
  file_size_ = static_cast<uint64_t>(st.st_size);
  mtime_ns_ = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
  try {
    // Hash of the first and last 64 KiB: catches rewrites that keep size and mtime (e.g. copied with -p).
    std::string buf(std::min(kHashWindow, file_size_), '\0');
    pread_all(fd_, buf.data(), buf.size(), 0, path_);
    content_hash_ = fnv1a(buf.data(), buf.size(), 0xcbf29ce484222325ULL);
    if (file_size_ > kHashWindow) {
      buf.assign(kHashWindow, '\0');
      pread_all(fd_, buf.data(), buf.size(), file_size_ - kHashWindow, path_);
      content_hash_ = fnv1a(buf.data(), buf.size(), content_hash_);
    }
    if (use_cache && load_cache()) {
      source_ = IndexSource::kCache;
      return;
    }
    scan();
    source_ = IndexSource::kScanned;
    if (use_cache) write_cache();
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

RecordFile::~RecordFile() {
  if (fd_ >= 0) ::close(fd_);
}

// One pass over the bytes, tracking string/escape state and bracket depth. Records are the objects at depth
// `base` (0 for JSONL / concatenated objects, 1 inside a top-level list).
void RecordFile::scan() {
  spans_.clear();
  constexpr size_t kBlock = 4 << 20;
  std::string buf(kBlock, '\0');
  int base = -1;  // unknown until the first non-whitespace byte
  int depth = 0;
  bool in_string = false, escape = false, list_closed = false, want_value = true;
  uint64_t start = 0;
  auto fail = [&](uint64_t pos, const std::string& why) {
    throw std::runtime_error(path_ + ": not a JSON list or JSONL of record objects: " + why + " at byte " +
                             std::to_string(pos) + " (after record " + std::to_string(spans_.size()) + ")");
  };
  for (uint64_t off = 0; off < file_size_; off += kBlock) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kBlock, file_size_ - off));
    pread_all(fd_, buf.data(), n, off, path_);
    const char* p = buf.data();
    size_t i = 0;
    if (off == 0 && n >= 3 && std::memcmp(p, "\xEF\xBB\xBF", 3) == 0) i = 3;  // UTF-8 BOM
    for (; i < n; ++i) {
      const char c = p[i];
      if (in_string) {
        if (escape) {
          escape = false;
        } else if (c == '\\') {
          escape = true;
        } else if (c == '"') {
          in_string = false;
        } else {
          // Most bytes are string contents: jump to the next quote or backslash (memchr, SIMD in glibc), the
          // backslash searched only up to that quote.
          const char* q = static_cast<const char*>(std::memchr(p + i, '"', n - i));
          const size_t end = q ? size_t(q - p) : n;
          const char* b = static_cast<const char*>(std::memchr(p + i, '\\', end - i));
          i = (b ? size_t(b - p) : end) - 1;  // the loop's ++i lands on it
        }
        continue;
      }
      if (depth > base && base >= 0) {  // inside a record: only brackets and strings matter
        if (c == '"') {
          in_string = true;
        } else if (c == '{' || c == '[') {
          ++depth;
        } else if (c == '}' || c == ']') {
          if (--depth == base) {
            if (c != '}') fail(off + i, "record closed with ']'");
            spans_.push_back({start, off + i + 1 - start});
            want_value = false;
          }
        }
        continue;
      }
      if (is_ws(c)) continue;
      if (base < 0) {  // first significant byte decides the format
        if (c == '[') {
          base = 1;
          depth = 1;
          jsonl_ = false;
          continue;
        }
        if (c == '{') {
          base = 0;
          jsonl_ = true;
        } else {
          fail(off + i, "expected '[' or '{', found " + describe_char(c));
        }
      }
      if (list_closed) fail(off + i, "text after the closing ']' (" + describe_char(c) + ")");
      if (c == '{') {
        if (!jsonl_ && !want_value) fail(off + i, "missing ',' between records");
        start = off + i;
        ++depth;
      } else if (!jsonl_ && c == ',' && !want_value) {
        want_value = true;
      } else if (!jsonl_ && c == ']' && depth == 1) {
        if (want_value && !spans_.empty()) fail(off + i, "trailing ',' before ']'");
        depth = 0;
        list_closed = true;
      } else {
        fail(off + i, "expected a record object, found " + describe_char(c));
      }
    }
  }
  if (base < 0) throw std::runtime_error(path_ + ": empty record file (expected a JSON list or JSONL)");
  if (in_string || depth > base) fail(file_size_, "unterminated record (unbalanced brackets or quotes)");
  if (!jsonl_ && !list_closed) fail(file_size_, "missing closing ']'");
}

namespace {

// Cache files beside the index: 8 magic bytes, then 64-bit words: the data file's size, mtime (ns) and content
// hash (its key), then the file's own fields. Reads the words of `fd` into `words` when the magic and the key
// match.
bool read_keyed_header(int fd, const char (&magic)[8], const std::array<uint64_t, 3>& key, uint64_t* words,
                       size_t n) {
  char m[8];
  std::vector<uint64_t> w(n);
  if (::pread(fd, m, 8, 0) != 8 || std::memcmp(m, magic, 8) != 0) return false;
  const ssize_t bytes = static_cast<ssize_t>(n * sizeof(uint64_t));
  if (::pread(fd, w.data(), size_t(bytes), 8) != bytes) return false;
  if (w[0] != key[0] || w[1] != key[1] || w[2] != key[2]) return false;
  std::copy(w.begin(), w.end(), words);
  return true;
}

}  // namespace

bool RecordFile::load_cache() {
  int fd = ::open(cache_path(path_).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  uint64_t h[5];  // size, mtime, hash, jsonl, count
  bool ok = read_keyed_header(fd, kMagic, cache_key(), h, 5) && h[4] <= file_size_;
  if (ok) {
    std::vector<RecordSpan> spans(h[4]);
    const size_t bytes = h[4] * sizeof(RecordSpan);
    ok = bytes == 0 || ::pread(fd, spans.data(), bytes, 8 + sizeof h) == static_cast<ssize_t>(bytes);
    for (size_t i = 0; ok && i < spans.size(); ++i) ok = spans[i].offset + spans[i].length <= file_size_;
    if (ok) {
      spans_ = std::move(spans);
      jsonl_ = h[3] != 0;
    }
  }
  ::close(fd);
  return ok;
}

namespace {

// Written to a temporary name and renamed, so concurrent readers (several ranks) never see a partial file. Every
// rank that finds no valid cache writes one, and on a shared file system ranks of different nodes may have the same
// pid (containers start them at the same small numbers): the host name keeps their temporary files apart.
bool write_file_atomic(const std::string& path, const std::string& bytes) {
  char host[64] = {0};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "host");
  const std::string tmp = path + ".tmp." + host + "." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool ok = true;
  for (size_t done = 0; ok && done < bytes.size();) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = (::close(fd) == 0) && ok;
  if (ok && ::rename(tmp.c_str(), path.c_str()) == 0) return true;
  ::unlink(tmp.c_str());
  return false;
}

void put_u64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }

// The magic and the key words every cache file starts with (read_keyed_header reads them back).
std::string keyed_header(const char (&magic)[8], const std::array<uint64_t, 3>& key) {
  std::string out(magic, 8);
  for (uint64_t w : key) put_u64(out, w);
  return out;
}

constexpr char kDerivedMagic[8] = {'G', 'M', 'O', 'D', 'D', 'R', 'V', '1'};

}  // namespace

// An unwritable directory is not an error: the index then lives in memory only.
void RecordFile::write_cache() {
  std::string out = keyed_header(kMagic, cache_key());
  put_u64(out, jsonl_ ? 1 : 0);
  put_u64(out, spans_.size());
  out.append(reinterpret_cast<const char*>(spans_.data()), spans_.size() * sizeof(RecordSpan));
  cache_written_ = write_file_atomic(cache_path(path_), out);
}

bool RecordFile::write_derived(const std::string& tag, const std::vector<int64_t>& values) const {
  if (!use_cache_ || values.size() != spans_.size()) return false;
  std::string out = keyed_header(kDerivedMagic, cache_key());
  put_u64(out, values.size());
  out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int64_t));
  return write_file_atomic(cache_path(path_) + "." + tag, out);
}

bool RecordFile::load_derived(const std::string& tag, std::vector<int64_t>& out) const {
  if (!use_cache_) return false;
  int fd = ::open((cache_path(path_) + "." + tag).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  uint64_t h[4];  // size, mtime, hash, count
  bool ok = read_keyed_header(fd, kDerivedMagic, cache_key(), h, 4) && h[3] == spans_.size();
  if (ok) {
    std::vector<int64_t> v(h[3]);
    const size_t bytes = h[3] * sizeof(int64_t);
    ok = bytes == 0 || ::pread(fd, v.data(), bytes, 8 + sizeof h) == static_cast<ssize_t>(bytes);
    if (ok) out = std::move(v);
  }
  ::close(fd);
  return ok;
}

std::string RecordFile::raw(size_t i) const {
  if (i >= spans_.size())
    throw std::out_of_range(path_ + ": record " + std::to_string(i) + " out of range (" +
                            std::to_string(spans_.size()) + " records)");
  std::string text(spans_[i].length, '\0');
  pread_all(fd_, text.data(), text.size(), spans_[i].offset, path_);
  return text;
}

void RecordFile::read_bytes(uint64_t offset, char* dst, uint64_t len) const {
  if (offset > file_size_ || len > file_size_ - offset)
    throw std::out_of_range(path_ + ": bytes [" + std::to_string(offset) + ", " + std::to_string(offset + len) +
                            ") asked, the file has " + std::to_string(file_size_));
  pread_all(fd_, dst, len, offset, path_);
}

Record RecordFile::get(size_t i) const {
  return parse_record(raw(i), path_ + ": record " + std::to_string(i));
}

Record parse_record(const std::string& json_text, const std::string& where) {
  using nlohmann::json;
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    const std::string id = guess_id(json_text);
    throw RecordError(where + (id.empty() ? "" : " (id '" + id + "')") + ": malformed JSON: " + e.what(), id);
  }
  Record r;
  std::string label = where;
  auto bad = [&](const std::string& why) { throw RecordError(label + ": " + why, r.id); };
  if (!j.is_object()) bad("record is not a JSON object");
  if (auto it = j.find("id"); it != j.end()) {
    if (it->is_string()) {
      r.id = it->get<std::string>();
    } else if (it->is_number_integer()) {
      r.id = std::to_string(it->get<int64_t>());
    } else if (it->is_number_unsigned()) {
      r.id = std::to_string(it->get<uint64_t>());
    } else if (!it->is_null()) {
      bad("\"id\" must be a string or an integer");
    }
  }
  label = where + " (id '" + r.id + "')";
  // Media paths: a string or a list of non-empty strings.
  auto paths = [&](const char* key, std::vector<std::string>& out) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return;
    if (it->is_string()) {
      out.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const auto& x : *it) {
        if (!x.is_string()) bad(std::string("\"") + key + "\" list must hold strings");
        out.push_back(x.get<std::string>());
      }
    } else {
      bad(std::string("\"") + key + "\" must be a string or a list of strings");
    }
    for (const auto& p : out)
      if (p.empty()) bad(std::string("empty path in \"") + key + "\"");
  };
  const bool llava = j.contains("conversations"), sharegpt = j.contains("messages");
  if (llava && sharegpt) bad("has both \"conversations\" (LLaVA layout) and \"messages\" (ShareGPT layout)");
  // Each layout's media keys; the other layout's spelling is refused rather than silently ignored.
  const char* image_key = sharegpt ? "images" : "image";
  const char* video_key = sharegpt ? "videos" : "video";
  const auto foreign = [&](const char* other, const char* ours) {
    if (j.contains(other))
      bad(std::string("\"") + other + "\" does not belong to the " + (sharegpt ? "ShareGPT" : "LLaVA") +
          " layout; use \"" + ours + "\"");
  };
  foreign(sharegpt ? "image" : "images", image_key);
  foreign(sharegpt ? "video" : "videos", video_key);
  paths(image_key, r.images);
  paths(video_key, r.videos);
  if (!llava && !sharegpt) bad("missing \"conversations\" (LLaVA layout) or \"messages\" (ShareGPT layout)");
  const char* list_key = sharegpt ? "messages" : "conversations";
  const json& conv = j[list_key];
  if (!conv.is_array()) bad(std::string("\"") + list_key + "\" must be a list");
  if (conv.empty()) bad(std::string("\"") + list_key + "\" is empty");
  // LLaVA turns: {"from": "human"|"gpt", "value"}; ShareGPT messages: {"role": "user"|"assistant", "content"}.
  const char* role_key = sharegpt ? "role" : "from";
  const char* text_key = sharegpt ? "content" : "value";
  size_t t = 0;
  for (const auto& turn : conv) {
    const std::string tw = (sharegpt ? "message " : "turn ") + std::to_string(t++);
    if (!turn.is_object()) bad(tw + " is not an object");
    auto from = turn.find(role_key);
    auto value = turn.find(text_key);
    if (from == turn.end() || !from->is_string()) bad(tw + ": missing string \"" + role_key + "\"");
    if (value == turn.end() || !value->is_string()) bad(tw + ": missing string \"" + text_key + "\"");
    std::string f = from->get<std::string>();
    if (sharegpt) {
      if (f == "user") {
        f = "human";
      } else if (f == "assistant") {
        f = "gpt";
      } else {
        bad(tw + ": \"role\" must be \"user\" or \"assistant\", got \"" + f + "\"" +
            (f == "system" ? " (the conversation template gives the system prompt)" : ""));
      }
    } else if (f != "human" && f != "gpt") {
      bad(tw + ": role \"from\" must be \"human\" or \"gpt\", got \"" + f + "\"");
    }
    r.conversations.push_back({std::move(f), value->get<std::string>()});
  }
  return r;
}

}  // namespace gmod

// Byte-level BPE from tokenizer.json: PCRE2 pre-tokenizers, ranked merges, byte-level decode (the added-token split:
// bpe_added_tokens.h).
#include "data/bpe_tokenizer.h"
#include "data/bpe_added_tokens.h"
#include "data/pcre2_regex.h"
#include "data/utf8.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <shared_mutex>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace gmod {
namespace {

using json = nlohmann::json;
using bpe::Added;
using bpe::AddedMatcher;
using bpe::Segment;
using bpe::split_added;

// ---------------------------------------------------------------- PCRE2
const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// PCRE2 regex whose compile errors name the tokenizer file (an unsupported pre-tokenizer pattern).
std::shared_ptr<Pcre2Regex> make_regex(const std::string& pattern, bool literal, const std::string& origin) {
  try {
    return std::make_shared<Pcre2Regex>(pattern, literal);
  } catch (const std::invalid_argument& e) {
    throw UnsupportedTokenizerError("tokenizer.json '" + origin + "': pre-tokenizer " + e.what());
  }
}

// ---------------------------------------------------------------- pre-tokenizer
enum class Behavior { Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous };

struct Step {
  bool byte_level = false;
  std::shared_ptr<Pcre2Regex> re;  // Split/Digits pattern, or the GPT-2 regex for ByteLevel(use_regex)
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
  bool add_prefix_space = false;
};

// tokenizers' NormalizedString::split: matches and gaps, flags inverted, then merged by `behavior`.
void split_piece(const Step& st, const std::string& piece, std::vector<std::string>& out) {
  using Span = std::pair<std::pair<size_t, size_t>, bool>;  // offsets, is_match
  std::vector<Span> m;
  size_t prev = 0;
  st.re->for_each_match(piece, [&](size_t b, size_t e) {
    if (prev != b) m.push_back({{prev, b}, false});
    m.push_back({{b, e}, true});
    prev = e;
  });
  if (prev != piece.size() || piece.empty()) m.push_back({{prev, piece.size()}, false});
  if (st.invert)
    for (auto& x : m) x.second = !x.second;
  std::vector<Span> r;  // offsets, remove
  bool prev_match = false;
  switch (st.behavior) {
    case Behavior::Isolated:
      for (auto& x : m) r.push_back({x.first, false});
      break;
    case Behavior::Removed:
      r = m;
      break;
    case Behavior::Contiguous:
      for (auto& x : m) {
        if (x.second == prev_match && !r.empty()) r.back().first.second = x.first.second;
        else r.push_back({x.first, false});
        prev_match = x.second;
      }
      break;
    case Behavior::MergedWithPrevious:
      for (auto& x : m) {
        if (x.second && !prev_match && !r.empty()) r.back().first.second = x.first.second;
        else r.push_back({x.first, false});
        prev_match = x.second;
      }
      break;
    case Behavior::MergedWithNext:
      for (auto it = m.rbegin(); it != m.rend(); ++it) {
        if (it->second && !prev_match && !r.empty()) r.back().first.first = it->first.first;
        else r.push_back({it->first, false});
        prev_match = it->second;
      }
      std::reverse(r.begin(), r.end());
      break;
  }
  for (auto& x : r)
    if (!x.second && x.first.second > x.first.first)
      out.push_back(piece.substr(x.first.first, x.first.second - x.first.first));
}

// GPT-2 bytes_to_unicode: printable bytes map to themselves, the rest to U+0100 onwards.
std::array<uint32_t, 256> byte_to_cp_table() {
  std::array<uint32_t, 256> t{};
  uint32_t n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    t[b] = keep ? b : 256 + n++;
  }
  return t;
}

std::string json_token_name(const json& v) {  // "x" or {"content": "x", ...} or null
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("tokenizer.json '" + path + "': cannot open file");
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

}  // namespace

// ---------------------------------------------------------------- Impl
struct BpeTokenizer::Impl {
  std::string origin;
  std::vector<std::string> id_to_token;  // model vocab and added tokens; "" = unused id
  std::vector<bool> id_used;
  std::unordered_map<std::string, int32_t> vocab;  // model vocab only
  std::vector<Added> added;
  std::unordered_map<std::string, int32_t> added_ids;
  std::unordered_set<int32_t> special_ids;
  AddedMatcher match_raw, match_norm;  // normalized=false tokens, then normalized=true ones
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left, right) -> (rank, merged)
  std::vector<Step> steps;
  std::array<uint32_t, 256> byte_cp = byte_to_cp_table();
  std::array<std::string, 256> byte_char;  // UTF-8 of byte_cp
  std::array<int32_t, 256> byte_id;        // vocab id of byte_char (no prefix/suffix), -1 if absent
  std::unordered_map<uint32_t, uint8_t> cp_byte;
  std::string prefix, suffix;  // continuing_subword_prefix, end_of_word_suffix
  std::optional<int32_t> unk, bos, eos, pad;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;

  static constexpr size_t kCacheMaxWord = 256, kCacheMaxEntries = 1 << 18;
  mutable std::shared_mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("tokenizer.json '" + origin + "': " + what);
  }
  [[noreturn]] void unsupported(const std::string& what) const {
    throw UnsupportedTokenizerError("tokenizer.json '" + origin + "': unsupported " + what);
  }

  void set_id(const std::string& tok, int64_t id) {
    if (id < 0 || id > INT32_MAX) fail("token id " + std::to_string(id) + " out of range for '" + tok + "'");
    if (static_cast<size_t>(id) >= id_to_token.size()) id_to_token.resize(id + 1), id_used.resize(id + 1);
    id_to_token[id] = tok;
    id_used[id] = true;
  }

  void parse_pre_tokenizer(const json& p) {
    if (p.is_null()) return;
    const std::string type = p.value("type", "");
    if (type == "Sequence") {
      for (const auto& q : p.at("pretokenizers")) parse_pre_tokenizer(q);
    } else if (type == "ByteLevel") {
      Step s;
      s.byte_level = true;
      s.add_prefix_space = p.value("add_prefix_space", true);
      if (p.value("use_regex", true)) s.re = make_regex(kGpt2Pattern, false, origin);
      steps.push_back(std::move(s));
    } else if (type == "Split") {
      Step s;
      const json& pat = p.at("pattern");
      if (pat.contains("Regex")) s.re = make_regex(pat["Regex"].get<std::string>(), false, origin);
      else if (pat.contains("String")) s.re = make_regex(pat["String"].get<std::string>(), true, origin);
      else fail("Split pre-tokenizer without a Regex or String pattern");
      const std::string b = p.value("behavior", "Isolated");
      static const std::unordered_map<std::string, Behavior> kB = {
          {"Isolated", Behavior::Isolated}, {"Removed", Behavior::Removed},
          {"MergedWithPrevious", Behavior::MergedWithPrevious}, {"MergedWithNext", Behavior::MergedWithNext},
          {"Contiguous", Behavior::Contiguous}};
      if (!kB.count(b)) unsupported("Split behavior '" + b + "'");
      s.behavior = kB.at(b);
      s.invert = p.value("invert", false);
      steps.push_back(std::move(s));
    } else if (type == "Digits") {
      Step s;
      s.re = make_regex(R"(\p{N})", false, origin);
      s.behavior = p.value("individual_digits", false) ? Behavior::Isolated : Behavior::Contiguous;
      steps.push_back(std::move(s));
    } else {
      unsupported("pre_tokenizer type '" + type + "' (supported: ByteLevel, Split, Digits, Sequence)");
    }
  }

  void load(const std::string& text, const std::string& config_text) {
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      fail(std::string("malformed JSON: ") + e.what());
    }
    try {
      load_json(j);
    } catch (const json::exception& e) {
      fail(std::string("unexpected structure: ") + e.what());
    }
    if (!config_text.empty()) {
      json c;
      try {
        c = json::parse(config_text);
      } catch (const json::exception& e) {
        fail(std::string("malformed tokenizer_config.json beside it: ") + e.what());
      }
      apply_config(c);
    }
  }

  void apply_config(const json& c) {
    auto pick = [&](const char* key, std::optional<int32_t>& dst) {
      if (!c.is_object() || !c.contains(key)) return;
      const std::string name = json_token_name(c[key]);
      if (name.empty()) return;
      if (auto id = token_id(name)) dst = id;
    };
    pick("bos_token", bos);
    pick("eos_token", eos);
    pick("pad_token", pad);
    pick("unk_token", unk);
  }

  void load_json(const json& j) {
    if (!j.is_object() || !j.contains("model")) fail("no \"model\" section (is this a tokenizer.json?)");
    const json& m = j["model"];
    const std::string type = m.value("type", m.contains("merges") ? "BPE" : "");
    if (type != "BPE")
      unsupported("model type '" + type + "': only byte-level BPE tokenizer.json is implemented");
    // Byte-level check: SentencePiece-converted BPE (Metaspace) would tokenise wrongly here.
    bool has_byte_level = false;
    const auto scan = [&](const json& p, const char* list) {
      if (p.is_null()) return;
      if (p.value("type", "") == "ByteLevel") has_byte_level = true;
      if (p.contains(list))
        for (const auto& q : p[list]) has_byte_level |= q.value("type", "") == "ByteLevel";
    };
    if (j.contains("pre_tokenizer")) scan(j["pre_tokenizer"], "pretokenizers");
    if (!has_byte_level)
      unsupported("BPE without a ByteLevel pre-tokenizer (SentencePiece-style/Metaspace tokenizer.json; "
                  "load tokenizer.model instead)");
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
      const json& n = j["normalizer"];
      const std::string nt = n.value("type", "");
      const bool empty_seq = nt == "Sequence" && n.value("normalizers", json::array()).empty();
      if (nt != "NFC" && !empty_seq) unsupported("normalizer '" + nt + "' (only none or NFC)");
    }
    parse_pre_tokenizer(j["pre_tokenizer"]);
    for (size_t i = 0; i + 1 < steps.size(); ++i)
      if (steps[i].byte_level) unsupported("pre-tokenizer sequence with ByteLevel before its last step");
    if (steps.empty() || !steps.back().byte_level) unsupported("pre-tokenizer sequence not ending in ByteLevel");

    for (const auto& [tok, id] : m.at("vocab").items()) {
      vocab[tok] = id.get<int32_t>();
      set_id(tok, id.get<int64_t>());
    }
    auto opt_str = [&](const char* k) {
      return m.contains(k) && m[k].is_string() ? m[k].get<std::string>() : std::string();
    };
    prefix = opt_str("continuing_subword_prefix");
    suffix = opt_str("end_of_word_suffix");
    fuse_unk = m.value("fuse_unk", false);
    byte_fallback = m.value("byte_fallback", false);
    ignore_merges = m.value("ignore_merges", false);
    const std::string unk_tok = opt_str("unk_token");
    if (!unk_tok.empty() && vocab.count(unk_tok)) unk = vocab[unk_tok];

    int32_t rank = 0;
    for (const auto& mg : m.at("merges")) {
      std::string a, b;
      if (mg.is_string()) {
        const std::string s = mg.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          fail("merge " + std::to_string(rank) + " '" + s + "' is not of the form \"a b\"");
        a = s.substr(0, sp), b = s.substr(sp + 1);
      } else if (mg.is_array() && mg.size() == 2) {
        a = mg[0].get<std::string>(), b = mg[1].get<std::string>();
      } else {
        fail("merge " + std::to_string(rank) + " is neither \"a b\" nor [a, b]");
      }
      const auto ia = vocab.find(a), ib = vocab.find(b), iab = vocab.find(a + b);
      if (ia == vocab.end() || ib == vocab.end() || iab == vocab.end())
        fail("merge " + std::to_string(rank) + " ('" + a + "', '" + b + "') uses a token missing from the vocab");
      merges.emplace(key(ia->second, ib->second), std::make_pair(rank, iab->second));
      ++rank;
    }

    if (j.contains("added_tokens"))
      for (const auto& t : j["added_tokens"])
        added.push_back({t.at("content").get<std::string>(), t.at("id").get<int32_t>(), t.value("single_word", false),
                         t.value("lstrip", false), t.value("rstrip", false), t.value("normalized", false),
                         t.value("special", false)});
    for (const Added& t : added) {
      set_id(t.content, t.id);
      added_ids[t.content] = t.id;
      if (t.special) special_ids.insert(t.id);
      (t.normalized ? match_norm : match_raw).add(&t);
    }
    for (int b = 0; b < 256; ++b) {
      utf8::append(byte_char[b], byte_cp[b]);
      cp_byte[byte_cp[b]] = static_cast<uint8_t>(b);
      const auto it = vocab.find(byte_char[b]);
      byte_id[b] = it == vocab.end() ? -1 : it->second;
    }
  }

  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  std::optional<int32_t> token_id(const std::string& t) const {
    if (auto it = added_ids.find(t); it != added_ids.end()) return it->second;
    if (auto it = vocab.find(t); it != vocab.end()) return it->second;
    return std::nullopt;
  }

  // BPE of one pre-tokenized piece given as raw bytes; appends ids.
  void bpe(const std::string& raw, std::vector<int32_t>& out) const {
    const bool cacheable = raw.size() < kCacheMaxWord;
    if (cacheable) {
      std::shared_lock lk(cache_mu);
      if (auto it = cache.find(raw); it != cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> ids;
    merge_word(raw, ids);
    out.insert(out.end(), ids.begin(), ids.end());
    if (cacheable) {
      std::unique_lock lk(cache_mu);
      if (cache.size() >= kCacheMaxEntries) cache.clear();
      cache.emplace(raw, std::move(ids));
    }
  }

  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  struct Merge {
    int32_t rank, pos, new_id;
    bool operator<(const Merge& o) const {  // priority_queue top = lowest rank, then leftmost
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };

  void merge_word(const std::string& raw, std::vector<int32_t>& out) const {
    if (ignore_merges) {
      std::string mapped;
      for (unsigned char c : raw) mapped += byte_char[c];
      if (auto it = vocab.find(mapped); it != vocab.end()) return out.push_back(it->second);
    }
    std::vector<Symbol> sym;
    sym.reserve(raw.size());
    bool last_unk = false;
    for (size_t i = 0; i < raw.size(); ++i) {
      const auto c = static_cast<unsigned char>(raw[i]);
      int32_t id = -1;
      if (prefix.empty() && suffix.empty()) {
        id = byte_id[c];
      } else {
        std::string t = (i > 0 ? prefix : std::string()) + byte_char[c] + (i + 1 == raw.size() ? suffix : "");
        if (auto it = vocab.find(t); it != vocab.end()) id = it->second;
      }
      if (id < 0 && byte_fallback) {
        std::vector<int32_t> bytes;
        for (unsigned char u : byte_char[c]) {
          char hex[8];
          std::snprintf(hex, sizeof hex, "<0x%02X>", u);
          auto it = vocab.find(hex);
          if (it == vocab.end()) break;
          bytes.push_back(it->second);
        }
        if (bytes.size() == byte_char[c].size()) {
          for (int32_t b : bytes) sym.push_back({b, 0, 0, true});
          last_unk = false;
          continue;
        }
      }
      if (id < 0) {
        if (!unk) continue;  // tokenizers drops characters it cannot represent when there is no unk token
        if (fuse_unk && last_unk) continue;
        id = *unk;
        last_unk = true;
      } else {
        last_unk = false;
      }
      sym.push_back({id, 0, 0, true});
    }
    const int32_t n = static_cast<int32_t>(sym.size());
    for (int32_t i = 0; i < n; ++i) sym[i].prev = i - 1, sym[i].next = i + 1 < n ? i + 1 : -1;
    std::priority_queue<Merge> q;
    for (int32_t i = 0; i + 1 < n; ++i)
      if (auto it = merges.find(key(sym[i].id, sym[i + 1].id)); it != merges.end())
        q.push({it->second.first, i, it->second.second});
    while (!q.empty()) {
      const Merge top = q.top();
      q.pop();
      Symbol& cur = sym[top.pos];
      if (!cur.alive || cur.next < 0) continue;
      const int32_t nxt = cur.next;
      auto it = merges.find(key(cur.id, sym[nxt].id));
      if (it == merges.end() || it->second.second != top.new_id) continue;  // stale entry
      cur.id = top.new_id;
      sym[nxt].alive = false;
      cur.next = sym[nxt].next;
      if (cur.next >= 0) sym[cur.next].prev = top.pos;
      if (cur.prev >= 0)
        if (auto m = merges.find(key(sym[cur.prev].id, cur.id)); m != merges.end())
          q.push({m->second.first, cur.prev, m->second.second});
      if (cur.next >= 0)
        if (auto m = merges.find(key(cur.id, sym[cur.next].id)); m != merges.end())
          q.push({m->second.first, top.pos, m->second.second});
    }
    for (const Symbol& s : sym)
      if (s.alive) out.push_back(s.id);
  }

  void encode_text(std::string_view text, std::vector<int32_t>& out) const {
    std::vector<std::string> pieces{std::string(text)}, next;
    for (const Step& st : steps) {
      next.clear();
      for (std::string& p : pieces) {
        if (st.byte_level && st.add_prefix_space && p[0] != ' ') p.insert(p.begin(), ' ');
        if (st.re) split_piece(st, p, next);
        else next.push_back(std::move(p));
      }
      pieces.swap(next);
    }
    for (const std::string& p : pieces) bpe(p, out);
  }
};

// ---------------------------------------------------------------- BpeTokenizer
BpeTokenizer::BpeTokenizer(const std::string& json_path) : impl_(std::make_unique<Impl>()) {
  impl_->origin = json_path;
  impl_->load(read_file(json_path), "");
  // Role names live beside tokenizer.json; special_tokens_map.json is read second and wins, as in transformers.
  // (POSIX stat, not std::filesystem: libtorch.so exports clashing std::filesystem symbols.)
  const size_t slash = json_path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? std::string() : json_path.substr(0, slash + 1);
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    const std::string p = dir + name;
    struct stat st;
    if (::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    json c;
    try {
      c = json::parse(read_file(p));
    } catch (const json::exception& e) {
      throw std::runtime_error("'" + p + "': malformed JSON: " + e.what());
    }
    impl_->apply_config(c);
  }
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_string(const std::string& json_text, const std::string& origin,
                                                        const std::string& config_json) {
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer());
  t->impl_ = std::make_unique<Impl>();
  t->impl_->origin = origin;
  t->impl_->load(json_text, config_json);
  return t;
}

BpeTokenizer::~BpeTokenizer() = default;

std::vector<int32_t> BpeTokenizer::encode(const std::string& text, bool parse_special) const {
  const Impl& im = *impl_;
  std::string clean;
  std::string_view s = text;
  if (!utf8::valid(s)) clean = utf8::lossy(s), s = clean;
  std::vector<Segment> first, segs;
  split_added(s, 0, im.match_raw, parse_special, first);
  for (const Segment& g : first) {
    if (g.id >= 0 || im.match_norm.empty()) segs.push_back(g);
    else split_added(s.substr(g.begin, g.end - g.begin), g.begin, im.match_norm, parse_special, segs);
  }
  std::vector<int32_t> out;
  out.reserve(s.size() / 3 + 4);
  for (const Segment& g : segs) {
    if (g.id >= 0) out.push_back(g.id);
    else im.encode_text(s.substr(g.begin, g.end - g.begin), out);
  }
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  const Impl& im = *impl_;
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= im.id_to_token.size() || !im.id_used[id])
      throw std::out_of_range("tokenizer.json '" + im.origin + "': id " + std::to_string(id) + " not in vocab");
    const std::string& tok = im.id_to_token[id];
    std::string mapped;
    bool ok = true;
    for (size_t i = 0; i < tok.size() && ok;) {
      size_t len;
      const int n = utf8::seq(tok, i);
      if (n < 0) { ok = false; break; }
      const auto it = im.cp_byte.find(utf8::code_point(tok, i, &len));
      if (it == im.cp_byte.end()) ok = false;
      else mapped += static_cast<char>(it->second);
      i += len;
    }
    bytes += ok ? mapped : tok;
  }
  return utf8::lossy(bytes);
}

int32_t BpeTokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_to_token.size()); }
std::optional<int32_t> BpeTokenizer::token_to_id(const std::string& token) const { return impl_->token_id(token); }
std::optional<int32_t> BpeTokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> BpeTokenizer::eos_id() const { return impl_->eos; }
std::optional<int32_t> BpeTokenizer::pad_id() const { return impl_->pad; }
std::optional<int32_t> BpeTokenizer::unk_id() const { return impl_->unk; }
bool BpeTokenizer::is_special(int32_t id) const { return impl_->special_ids.count(id) > 0; }
const std::string& BpeTokenizer::origin() const { return impl_->origin; }

std::optional<std::string> BpeTokenizer::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_token.size() || !impl_->id_used[id]) return std::nullopt;
  return impl_->id_to_token[id];
}

}  // namespace gmod

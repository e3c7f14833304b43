// Modality lengths from the record bytes: simdjson DOM per record, parse_record where that is not certain.
#include "data/record_lengths.h"

#include <simdjson.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <string_view>
#include <thread>

#include "data/records.h"

namespace gmod {
namespace {

inline unsigned is_space(unsigned char c) { return (c == ' ') | (c == '\n') | (c == '\t') | (c == '\r'); }

// Words = characters other than whitespace that follow whitespace or start the text. The strings are most of a
// record file's bytes: 16 at a time with SSE2 (x86-64's baseline), a whitespace bit mask per block and the word
// starts counted with popcount.
int64_t count_words(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  int64_t words = 0;
  unsigned prev_space = 1;  // the text starts after whitespace
  size_t i = 0;
#if defined(__SSE2__)
  const __m128i sp = _mm_set1_epi8(' '), nl = _mm_set1_epi8('\n'), tab = _mm_set1_epi8('\t'),
                cr = _mm_set1_epi8('\r');
  for (; i + 16 <= n; i += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
    const __m128i ws = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, sp), _mm_cmpeq_epi8(v, nl)),
                                    _mm_or_si128(_mm_cmpeq_epi8(v, tab), _mm_cmpeq_epi8(v, cr)));
    const unsigned m = unsigned(_mm_movemask_epi8(ws));          // bit k: byte k is whitespace
    const unsigned before = ((m << 1) | prev_space) & 0xFFFFu;   // bit k: byte k - 1 is whitespace
    words += __builtin_popcount(~m & before & 0xFFFFu);
    prev_space = m >> 15;
  }
#endif
  for (; i < n; ++i) {
    const unsigned space = is_space(p[i]);
    words += prev_space & !space;
    prev_space = space;
  }
  return words;
}

// The same, a character at a time: the reference path's count (modality_length_parsed), which the tests compare the
// fast path with.
int64_t count_words_scalar(const std::string& s) {
  int64_t words = 0;
  bool in_word = false;
  for (char c : s) {
    const bool ws = c == ' ' || c == '\n' || c == '\t' || c == '\r';
    if (!ws && !in_word) ++words;
    in_word = !ws;
  }
  return words;
}

int64_t length_of(bool has_image, int64_t words) { return has_image ? words + 128 : -std::max<int64_t>(words, 1); }

// A UTF-16 surrogate escape (\uD800-\uDFFF): parse_record's parser and simdjson may judge an unpaired one
// differently, so such a record takes the exact path.
bool has_surrogate_escape(const char* p, size_t n) {
  for (const char* q = p; (q = static_cast<const char*>(std::memchr(q, '\\', size_t(p + n - q)))) != nullptr;) {
    if (q + 2 < p + n && q[1] == 'u' && (q[2] == 'd' || q[2] == 'D')) return true;
    q += q + 1 < p + n && q[1] == '\\' ? 2 : 1;  // an escaped backslash starts no escape
  }
  return false;
}

// The fast path over `n` bytes at `p`, readable up to p + n + SIMDJSON_PADDING.
bool fast_length(simdjson::dom::parser& parser, const char* p, size_t n, int64_t& out) {
  using simdjson::dom::element;
  using simdjson::dom::element_type;
  if (has_surrogate_escape(p, n)) return false;
  element doc;
  if (parser.parse(p, n, /*realloc_if_needed=*/false).get(doc)) return false;
  simdjson::dom::object obj;
  if (doc.get_object().get(obj)) return false;
  bool seen_id = false, seen_image = false, seen_conv = false, has_image = false;
  element conv;
  for (simdjson::dom::key_value_pair field : obj) {
    if (field.key == "id") {
      if (seen_id) return false;
      seen_id = true;
      const element_type t = field.value.type();
      // Strings, 64-bit integers and null are ids; a float (or -0, which simdjson reads as one) is decided by the
      // exact path.
      if (t != element_type::STRING && t != element_type::INT64 && t != element_type::UINT64 &&
          t != element_type::NULL_VALUE)
        return false;
    } else if (field.key == "image") {
      if (seen_image) return false;
      seen_image = true;
      const element& v = field.value;
      if (v.type() == element_type::STRING) {
        std::string_view s;
        if (v.get_string().get(s) || s.empty()) return false;
        has_image = true;
      } else if (v.type() == element_type::ARRAY) {
        simdjson::dom::array list;
        if (v.get_array().get(list)) return false;
        for (element x : list) {
          std::string_view s;
          if (x.type() != element_type::STRING || x.get_string().get(s) || s.empty()) return false;
          has_image = true;
        }
      } else if (v.type() != element_type::NULL_VALUE) {
        return false;
      }
    } else if (field.key == "conversations") {
      if (seen_conv) return false;
      seen_conv = true;
      conv = field.value;
    } else {
      return false;  // a key parse_record may read (another layout, other media): its call
    }
  }
  simdjson::dom::array turns_list;
  if (!seen_conv || conv.get_array().get(turns_list)) return false;
  int64_t words = 0;
  size_t turns = 0;
  for (element turn : turns_list) {
    ++turns;
    simdjson::dom::object t;
    if (turn.get_object().get(t)) return false;
    bool seen_from = false, seen_value = false;
    std::string_view from, value;
    for (simdjson::dom::key_value_pair f : t) {
      if (f.key == "from") {
        if (seen_from || f.value.get_string().get(from)) return false;
        seen_from = true;
      } else if (f.key == "value") {
        if (seen_value || f.value.get_string().get(value)) return false;
        seen_value = true;
      } else {
        return false;
      }
    }
    if (!seen_from || !seen_value || (from != "human" && from != "gpt")) return false;
    words += count_words(value);
  }
  if (turns == 0) return false;
  out = length_of(has_image, words);
  return true;
}

}  // namespace

int64_t modality_length_parsed(const std::string& json_text, const std::string& where) {
  try {
    const Record r = parse_record(json_text, where);
    int64_t words = 0;
    for (const auto& t : r.conversations) words += count_words_scalar(t.value);
    return length_of(!r.images.empty(), words);
  } catch (const RecordError&) {
    return -1;
  }
}

bool modality_length_fast(const std::string& json_text, int64_t& out) {
  simdjson::dom::parser parser;
  const simdjson::padded_string padded(json_text);
  return fast_length(parser, padded.data(), json_text.size(), out);
}

std::vector<int64_t> compute_record_lengths(const RecordFile& records, size_t begin, size_t end, unsigned threads,
                                            size_t* fallbacks) {
  const std::vector<RecordSpan>& spans = records.spans();
  const size_t n = end - begin;
  std::vector<int64_t> out(n, -1);
  const size_t workers = std::max<size_t>(1, std::min<size_t>(std::max(1u, threads), (n + 4095) / 4096));
  std::vector<size_t> slow(workers, 0);
  std::vector<std::string> errors(workers);
  constexpr uint64_t kBlock = 8u << 20;  // bytes read at once: records are read in order, in large blocks
  auto work = [&](size_t w) {
    try {
      simdjson::dom::parser parser;
      std::string buf;
      size_t i = begin + n * w / workers;
      const size_t stop = begin + n * (w + 1) / workers;
      while (i < stop) {
        const uint64_t first = spans[i].offset;
        size_t j = i + 1;
        while (j < stop && spans[j].offset + spans[j].length - first <= kBlock) ++j;
        const uint64_t bytes = spans[j - 1].offset + spans[j - 1].length - first;
        buf.resize(bytes + simdjson::SIMDJSON_PADDING);
        records.read_bytes(first, buf.data(), bytes);
        std::memset(buf.data() + bytes, 0, simdjson::SIMDJSON_PADDING);
        for (size_t k = i; k < j; ++k) {
          const char* p = buf.data() + (spans[k].offset - first);
          int64_t v;
          if (!fast_length(parser, p, spans[k].length, v)) {
            v = modality_length_parsed(std::string(p, spans[k].length),
                                       records.path() + ": record " + std::to_string(k));
            ++slow[w];
          }
          out[k - begin] = v;
        }
        i = j;
      }
    } catch (const std::exception& e) {
      errors[w] = e.what();
    }
  };
  std::vector<std::thread> pool;
  for (size_t w = 1; w < workers; ++w) pool.emplace_back(work, w);
  work(0);
  for (auto& t : pool) t.join();
  for (const std::string& e : errors)
    if (!e.empty()) throw std::runtime_error(e);
  if (fallbacks) {
    *fallbacks = 0;
    for (size_t s : slow) *fallbacks += s;
  }
  return out;
}

}  // namespace gmod

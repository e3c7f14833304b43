// Added tokens of a tokenizer.json and their split out of the text before pre-tokenizing: a leftmost-longest
// matcher (aho-corasick MatchKind::LeftmostLongest semantics) and tokenizers' AddedVocabulary::find_matches
// rules (single_word, lstrip, rstrip; special tokens left as text without parse_special). Used by
// data/bpe_tokenizer.cpp.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gmod::bpe {

struct Added {
  std::string content;
  int32_t id;
  bool single_word, lstrip, rstrip, normalized, special;
};

// Leftmost-longest matcher over a set of added tokens (aho-corasick MatchKind::LeftmostLongest semantics).
class AddedMatcher {
 public:
  void add(const Added* t) {
    if (t->content.empty()) return;
    auto& v = by_first_[static_cast<unsigned char>(t->content[0])];
    v.push_back(t);
    std::stable_sort(v.begin(), v.end(),
                     [](const Added* a, const Added* b) { return a->content.size() > b->content.size(); });
  }
  bool empty() const {
    return std::all_of(by_first_.begin(), by_first_.end(), [](const auto& v) { return v.empty(); });
  }
  // Next match at or after `pos`: token and its start, or nullptr.
  const Added* find(std::string_view s, size_t pos, size_t* at) const {
    for (size_t i = pos; i < s.size(); ++i) {
      for (const Added* t : by_first_[static_cast<unsigned char>(s[i])])
        if (s.compare(i, t->content.size(), t->content) == 0) return *at = i, t;
    }
    return nullptr;
  }

 private:
  std::array<std::vector<const Added*>, 256> by_first_;
};

struct Segment {
  size_t begin, end;
  int32_t id;  // >= 0: an added token; -1: text to pre-tokenize
};

// tokenizers AddedVocabulary::find_matches on sentence s (offsets relative to s, shifted by `base`).
void split_added(std::string_view s, size_t base, const AddedMatcher& m, bool parse_special,
                 std::vector<Segment>& out);

}  // namespace gmod::bpe

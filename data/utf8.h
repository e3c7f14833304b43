// UTF-8 helpers for the byte-level BPE tokenizer: validation and lossy repair with the Unicode "maximal subpart"
// rule (as Rust's from_utf8_lossy and Python's errors="replace"), code point access and Unicode White_Space.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace gmod::utf8 {

// Length of the valid UTF-8 sequence at s[i], or -k where k >= 1 is the length of the maximal invalid subpart.
int seq(std::string_view s, size_t i);
bool valid(std::string_view s);
std::string lossy(std::string_view s);  // invalid subparts replaced by U+FFFD
uint32_t code_point(std::string_view s, size_t i, size_t* len);  // s must be valid at i
size_t prev(std::string_view s, size_t i);  // start of the character ending at i
void append(std::string& out, uint32_t cp);  // cp < 0x10000
bool is_white_space(uint32_t c);  // Unicode White_Space = Rust char::is_whitespace

}  // namespace gmod::utf8

// Reading a JSON config against a schema of defaults (the JSON of a default-constructed config): the merge
// that names unknown keys and wrong types, `--set key.path=value` overrides typed by the existing field, the
// 64-bit range and finite checks of every number, and which key a problem message is about.
// trainer/train_config.cpp uses it; the schema's number types say what a field is: signed = C++ int, unsigned
// = uint64_t, float = double.
#pragma once

#include <charconv>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace gmod::config_json {

// "boolean", "integer", "number", "string", "array", "object" or "null".
const char* type_name(const nlohmann::json& v);
// A double as printed in messages ("nan", "inf", "1e-08").
std::string num(double v);

// Decimal integer of the whole string (no blanks, no hex); throws naming what is wrong.
template <class T>
T parse_integer(const std::string& s) {
  T x{};
  const char* b = s.data();
  const char* e = b + s.size();
  if (b != e && *b == '+') ++b;
  const auto r = std::from_chars(b, e, x);
  if (r.ec == std::errc::result_out_of_range) throw std::invalid_argument("out of range of a 64-bit integer");
  if (r.ec != std::errc() || r.ptr != e || b == e) throw std::invalid_argument("not a decimal integer");
  return x;
}

// `user` merged into `dflt` (whose keys and types are the schema); problems appended to `errs`, each naming
// its key. A value of the wrong type is not merged (the default stays).
void merge_checked(nlohmann::json& dflt, const nlohmann::json& user, const std::string& path,
                   std::vector<std::string>& errs);

// "a.b=value" into the merged tree `cfg`, parsed by the existing field's type (integers decimal, 64-bit);
// `keys` gets the key of every override applied. A value that does not parse is not applied.
void apply_override(nlohmann::json& cfg, const std::string& ov, std::vector<std::string>& errs,
                    std::set<std::string>& keys);

// Every number of the merged tree `v` against the schema `d`: ints must fit 32 bits (4294967297 is an error, not 1)
// unless their key is in `int64_keys` (int64_t fields), floats must be finite, numbers in arrays are ints. A bad
// value is put back to its default; messages of keys in `overridden` end with " (from --set)".
void check_ranges(const nlohmann::json& d, nlohmann::json& v, const std::string& path,
                  const std::set<std::string>& overridden, const std::set<std::string>& int64_keys,
                  std::vector<std::string>& errs);

// The key a reading problem is about: "--set a.b=v: ..." / "a.b[1]: ..." / "a.b: ..." -> "a.b".
std::string problem_key(std::string message);
// True when the validation message `m` is about `key` or a field inside it ("key:", "key[", "key.", "key /").
bool about(const std::string& m, const std::string& key);

}  // namespace gmod::config_json

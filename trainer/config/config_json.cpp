#include "trainer/config/config_json.h"

#include <climits>
#include <cmath>
#include <sstream>

namespace gmod::config_json {

using json = nlohmann::json;

const char* type_name(const json& v) {
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  if (v.is_object()) return "object";
  return "null";
}

// `user` merged into `dflt` (whose keys and types are the schema); problems appended to `errs`.
void merge_checked(json& dflt, const json& user, const std::string& path, std::vector<std::string>& errs) {
  if (!user.is_object()) {
    errs.push_back((path.empty() ? "config" : path) + ": expected an object, got " + type_name(user));
    return;
  }
  for (auto it = user.begin(); it != user.end(); ++it) {
    const std::string key = path.empty() ? it.key() : path + "." + it.key();
    if (!dflt.contains(it.key())) {
      errs.push_back(key + ": unknown key");
      continue;
    }
    json& d = dflt[it.key()];
    const json& u = it.value();
    if (d.is_object()) {
      merge_checked(d, u, key, errs);
    } else if (d.is_number_float()     ? !u.is_number()
               : d.is_number_integer() ? !u.is_number_integer()
                                       : std::string(type_name(d)) != type_name(u)) {
      errs.push_back(key + ": expected " + type_name(d) + ", got " + type_name(u) + " (" + u.dump() + ")");
    } else if (d.is_number_unsigned() && u.is_number_integer() && u.get<int64_t>() < 0) {
      errs.push_back(key + ": expected a non-negative integer, got " + u.dump());
    } else if (d.is_number_float()) {
      d = u.get<double>();  // keep the field a float (`"lr": 1` must not make later overrides integer-typed)
    } else {
      d = u;
    }
  }
}

// "a.b=value" into the merged tree; the value is parsed according to the existing field's type. `keys` gets
// the key of every override applied (messages say when a bad value came from --set).
void apply_override(json& cfg, const std::string& ov, std::vector<std::string>& errs,
                    std::set<std::string>& keys) {
  const auto eq = ov.find('=');
  if (eq == std::string::npos || eq == 0) {
    errs.push_back("--set " + ov + ": expected key.path=value");
    return;
  }
  const std::string key = ov.substr(0, eq), value = ov.substr(eq + 1);
  json* node = &cfg;
  std::stringstream ss(key);
  std::string part;
  while (std::getline(ss, part, '.')) {
    if (!node->is_object() || !node->contains(part)) {
      errs.push_back("--set " + key + ": unknown key");
      return;
    }
    node = &(*node)[part];
  }
  json& d = *node;
  try {
    size_t used = 0;
    if (d.is_object()) {
      errs.push_back("--set " + key + ": is a section; set one of its fields");
      return;
    } else if (d.is_string()) {
      d = value;
    } else if (d.is_boolean()) {
      if (value != "true" && value != "false") throw std::invalid_argument("expected true or false");
      d = value == "true";
    } else if (d.is_number_unsigned()) {
      if (!value.empty() && value[0] == '-') throw std::invalid_argument("expected a non-negative integer");
      d = parse_integer<uint64_t>(value);
    } else if (d.is_number_integer()) {
      d = parse_integer<int64_t>(value);
    } else if (d.is_number_float()) {
      d = std::stod(value, &used);
    } else {  // arrays: JSON text, e.g. ["0-3"] or [1,2]
      json v = json::parse(value);
      if (!v.is_array()) throw std::invalid_argument("expected a JSON array");
      d = v;
    }
    if (used != 0 && used != value.size()) throw std::invalid_argument("trailing characters");
    keys.insert(key);
  } catch (const std::exception& e) {
    errs.push_back("--set " + key + "=" + value + ": cannot parse as " + type_name(d) + " (" + e.what() +
                   ")");
  }
}

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// One number `v` at `key` whose field the defaults `d` type: a signed default is a C++ int field (read as 64
// bits here, so 4294967297 is out of range instead of wrapping to 1), an unsigned one a uint64_t, a float a
// double that must be finite (nan/inf would switch clipping or the bad-data guard off, or freeze the
// weights).
void check_number(const json& d, const json& v, const std::string& key, bool int64, std::vector<std::string>& errs) {
  if (d.is_number_float() && v.is_number() && !std::isfinite(v.get<double>())) {
    errs.push_back(key + ": " + num(v.get<double>()) + " is not a finite number");
  } else if (d.is_number_integer() && !d.is_number_unsigned() && v.is_number_integer()) {
    const uint64_t max = int64 ? uint64_t(INT64_MAX) : uint64_t(INT_MAX);
    const bool too_big = v.is_number_unsigned() ? v.get<uint64_t>() > max
                                                : !int64 && (v.get<int64_t>() > INT_MAX || v.get<int64_t>() < INT_MIN);
    if (too_big)
      errs.push_back(key + ": " + v.dump() + " is out of range (a " + (int64 ? "64" : "32") +
                     "-bit integer, at most " + std::to_string(max) + ")");
  }
}

// Walks the merged tree `v` with the defaults `d` as schema (check_number on every number, also inside
// arrays); a value found bad is put back to its default (so that the rest can still be converted and
// validated).
void check_ranges(const json& d, json& v, const std::string& path, const std::set<std::string>& overridden,
                  const std::set<std::string>& int64_keys, std::vector<std::string>& errs) {
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!d.contains(it.key())) continue;
    const std::string key = path.empty() ? it.key() : path + "." + it.key();
    const json& dv = d[it.key()];
    json& vv = it.value();
    const size_t before = errs.size();
    if (dv.is_object() && vv.is_object()) {
      check_ranges(dv, vv, key, overridden, int64_keys, errs);
    } else if (vv.is_array()) {
      // Arrays of numbers (mod.config.mod_layers_idx): elements are ints.
      for (size_t i = 0; i < vv.size(); ++i)
        if (vv[i].is_number()) check_number(json(int(0)), vv[i], key + "[" + std::to_string(i) + "]", false, errs);
    } else if (vv.is_number()) {
      check_number(dv, vv, key, int64_keys.count(key) > 0, errs);
    }
    if (errs.size() > before && !dv.is_object()) vv = dv;
    if (overridden.count(key))
      for (size_t i = before; i < errs.size(); ++i) errs[i] += " (from --set)";
  }
}

// The key a reading problem is about: "--set a.b=v: ..." / "a.b[1]: ..." / "a.b: ..." -> "a.b".
std::string problem_key(std::string m) {
  if (m.rfind("--set ", 0) == 0) m = m.substr(6);
  return m.substr(0, m.find_first_of(":=[ "));
}

// True when the validation message `m` is about `key` or a field inside it ("key:", "key[", "key.", "key /").
bool about(const std::string& m, const std::string& key) {
  return !key.empty() && m.size() > key.size() && m.compare(0, key.size(), key) == 0 &&
         std::string(":[. /").find(m[key.size()]) != std::string::npos;
}

}  // namespace gmod::config_json

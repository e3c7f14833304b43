// The prefix and suffix tests C++17's std::string lacks (C++20 has them as members): one definition for every
// folder, so no translation unit carries its own copy (a unity build would see two).
#pragma once

#include <string>

namespace gmod {

inline bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace gmod

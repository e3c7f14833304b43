// The message of the exception a call throws, or "" when it returns: for tests that check a named error's
// text. error_of catches any std::exception; invalid_argument_of only std::invalid_argument (anything else
// propagates and fails the test), for the validators whose contract is that type.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

namespace gmod::test {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

inline std::string invalid_argument_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace gmod::test

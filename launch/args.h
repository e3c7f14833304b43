// The gmod command line on CLI11: the registry of subcommands (each cmd_*.cpp registers one) and the helpers
// they declare their options with, so that every subcommand's `--help` lists each option with its type,
// default and meaning, and every usage error (unknown option, missing value, bad or out-of-range value) is
// one message that names the option, exit code 2 (main.cpp).
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace gmod::cli {

// Exit codes of every subcommand (documented in `gmod --help`).
inline constexpr int kExitOk = 0;
inline constexpr int kExitRuntime = 1;  // an error found while working (a file, a model, a dataset)
inline constexpr int kExitUsage = 2;    // the command line itself is wrong

// A usage error found after parsing (options that need or exclude each other): exit code 2, as CLI11's own.
struct UsageError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// What runs a subcommand once its options are parsed; returns the exit code.
using Runner = std::function<int()>;

struct Command {
  const char* name;
  const char* summary;
  // Declares the command's options on its CLI11 subcommand (bound to state the returned Runner owns).
  Runner (*setup)(CLI::App& app);
};

// Registry filled by the cmd_*.cpp files through static registration.
std::vector<Command>& commands();
struct Register {
  Register(Command c) { commands().push_back(c); }
};

// "gmod 0.1.0 (LibTorch 2.x.y)": the CMake project version and the LibTorch it was built with.
std::string version_string();

// `s` as one POSIX shell word: single-quoted, an embedded ' written as '\''.
std::string shell_quote(const std::string& s);

// Validator: a decimal integer that fits T (no octal/hex, no wrap-around of out-of-range or negative values).
template <class T>
CLI::Validator integer_in_range() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        T x{};
        const char* b = s.data();
        const char* e = b + s.size();
        if (b != e && *b == '+') ++b;
        const auto r = std::from_chars(b, e, x);
        if (r.ec == std::errc::result_out_of_range)
          return "'" + s + "' is out of range (" + std::to_string(std::numeric_limits<T>::min()) + " to " +
                 std::to_string(std::numeric_limits<T>::max()) + ")";
        if (r.ec != std::errc() || r.ptr != e || b == e)
          return "'" + s + "' is not " + (std::is_signed_v<T> ? "an integer" : "a non-negative integer");
        s = std::to_string(x);  // decimal for CLI11's conversion, which would read "010" as octal
        return {};
      },
      "", "integer");
}

// Validators of a number's range, with messages that say the bound: "--steps: must be > 0, not 0". NaN and
// infinities are refused by all of them ("is not a finite number").
CLI::Validator positive();                     // > 0
CLI::Validator non_negative();                 // >= 0
CLI::Validator between(double lo, double hi);  // lo <= x <= hi
// --threads: 0 (LibTorch's default) to kMaxThreads.
inline constexpr int kMaxThreads = 1024;
CLI::Validator thread_count();

// Validator: a device LibTorch understands (cpu, cuda, cuda:1, ...).
CLI::Validator torch_device();

namespace detail {
template <class T>
CLI::Option* typed(CLI::Option* o) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    o->transform(integer_in_range<T>());  // transform: it may rewrite the value (check() may not)
    o->type_name(std::is_signed_v<T> ? "INT" : "UINT");
  } else if constexpr (std::is_floating_point_v<T>) {
    o->type_name("FLOAT");
  }
  return o;
}
}  // namespace detail

// `--name VALUE` bound to `v`; --help shows `v`'s value at declaration as the default (when not empty).
template <class T>
CLI::Option* add(CLI::App& app, const std::string& name, T& v, const std::string& help) {
  CLI::Option* o = detail::typed<T>(app.add_option(name, v, help));
  if (!o->get_positional()) o->capture_default_str();
  if (o->get_default_str().empty() || o->get_default_str() == "\"\"") o->default_str("");
  return o;
}

// A repeatable `--name VALUE` (one value per occurrence), every value kept in order.
CLI::Option* add(CLI::App& app, const std::string& name, std::vector<std::string>& v,
                 const std::string& help);

// `--name VALUE` whose absence means something (`v` stays empty).
template <class T>
CLI::Option* add(CLI::App& app, const std::string& name, std::optional<T>& v, const std::string& help) {
  return detail::typed<T>(app.add_option_function<T>(
      name, [&v](const T& x) { v = x; }, help));
}

// `--name` (takes no value).
CLI::Option* add_flag(CLI::App& app, const std::string& name, bool& v, const std::string& help);

}  // namespace gmod::cli

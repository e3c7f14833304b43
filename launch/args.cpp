#include "launch/args.h"

#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <cmath>
#include <sstream>

namespace gmod::cli {

std::vector<Command>& commands() {
  static std::vector<Command> c;
  return c;
}

std::string version_string() {
  return std::string("gmod ") + GMOD_VERSION + " (LibTorch " + TORCH_VERSION + ")";
}

CLI::Validator torch_device() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        try {
          c10::Device d(s);
          (void)d;
        } catch (const c10::Error&) {
          return "'" + s + "' is not a device (cpu, cuda, cuda:N)";
        }
        return {};
      },
      "", "device");
}

namespace {

CLI::Validator bound(double lo, double hi, bool lo_open, const std::string& desc) {
  return CLI::Validator(
      [=](std::string& s) -> std::string {
        double x = 0;
        try {
          size_t used = 0;
          x = std::stod(s, &used);
          if (used != s.size()) throw std::invalid_argument(s);
        } catch (const std::exception&) {
          return "'" + s + "' is not a number";
        }
        if (!std::isfinite(x)) return "'" + s + "' is not a finite number";
        if (lo_open ? !(x > lo) : !(x >= lo)) return "must be " + desc + ", not " + s;
        if (!(x <= hi)) return "must be " + desc + ", not " + s;
        return {};
      },
      desc, "bound");
}

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

CLI::Validator positive() { return bound(0, HUGE_VAL, true, "> 0"); }
CLI::Validator non_negative() { return bound(0, HUGE_VAL, false, ">= 0"); }
CLI::Validator between(double lo, double hi) {
  return bound(lo, hi, false, "in [" + num(lo) + ", " + num(hi) + "]");
}
CLI::Validator thread_count() { return between(0, kMaxThreads); }

CLI::Option* add(CLI::App& app, const std::string& name, std::vector<std::string>& v,
                 const std::string& help) {
  return app.add_option(name, v, help)->allow_extra_args(false)->type_name("TEXT");
}

CLI::Option* add_flag(CLI::App& app, const std::string& name, bool& v, const std::string& help) {
  return app.add_flag(name, v, help);
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace gmod::cli

#include "trainer/fault_injection.h"

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace gmod {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.push_back("");
  return out;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

}  // namespace

FaultInjection FaultInjection::parse(const std::string& spec) {
  FaultInjection out;
  auto fail = [&](const std::string& what) -> void {
    throw std::invalid_argument(
        std::string(kEnv) + "='" + spec + "': " + what +
        " (expected e.g. 'nonfinite_grad:step=3,rank=1[,count=2]', 'slow_arank:rank=0,seconds=8' or "
        "'slow_save:rank=2,seconds=60[,step=4]', faults separated by ';')");
  };
  if (trim(spec).empty()) return out;
  for (const std::string& raw : split(spec, ';')) {
    const std::string item = trim(raw);
    if (item.empty()) fail("empty fault");
    const auto colon = item.find(':');
    Fault f;
    f.kind = trim(item.substr(0, colon));
    if (f.kind != "nonfinite_grad" && f.kind != "slow_arank" && f.kind != "slow_save")
      fail("unknown fault kind '" + f.kind + "' (known: nonfinite_grad, slow_arank, slow_save)");
    // slow_*: rank and seconds (slow_save: step optional, the save of that step only); nonfinite_grad: step, rank,
    // count.
    const bool slow = f.kind != "nonfinite_grad";
    const bool slow_save = f.kind == "slow_save";
    if (colon == std::string::npos)
      fail("fault '" + f.kind + (slow ? "' needs rank= and seconds=" : "' needs step= and rank="));
    bool has_step = false, has_rank = false, has_count = false, has_seconds = false;
    for (const std::string& kv_raw : split(item.substr(colon + 1), ',')) {
      const std::string kv = trim(kv_raw);
      const auto eq = kv.find('=');
      if (eq == std::string::npos) fail("'" + kv + "' is not key=value");
      const std::string key = trim(kv.substr(0, eq)), val = trim(kv.substr(eq + 1));
      const bool known = slow_save ? key == "rank" || key == "seconds" || key == "step"
                         : slow    ? key == "rank" || key == "seconds"
                                   : key == "step" || key == "rank" || key == "count";
      if (!known)
        fail("unknown key '" + key + "' for " + f.kind +
             (slow_save ? " (known: rank, seconds, step)"
                        : slow ? " (known: rank, seconds)" : " (known: step, rank, count)"));
      int64_t v = 0;
      try {
        if (val.empty() || val.find_first_not_of("0123456789") != std::string::npos)
          throw std::invalid_argument("");
        v = std::stoll(val);
      } catch (const std::exception&) {
        fail(key + "='" + val + "' is not a non-negative decimal integer");
      }
      if (key == "step") {
        if (has_step) fail("step given twice");
        if (v < 1) fail("step must be >= 1 (steps count from 1)");
        f.step = v, has_step = true;
      } else if (key == "rank") {
        if (has_rank) fail("rank given twice");
        if (v > std::numeric_limits<int>::max()) fail("rank " + val + " is too large");
        f.rank = int(v), has_rank = true;
      } else if (key == "seconds") {
        if (has_seconds) fail("seconds given twice");
        if (v < 1 || v > 86400) fail("seconds must be in [1, 86400]");
        f.seconds = v, has_seconds = true;
      } else if (key == "count") {
        if (has_count) fail("count given twice");
        if (v < 1) fail("count must be >= 1");
        f.count = v, has_count = true;
      }
    }
    if (!slow && !has_step) fail(f.kind + " needs step=");
    if (!has_rank) fail(f.kind + " needs rank=");
    if (slow && !has_seconds) fail(f.kind + " needs seconds=");
    out.faults.push_back(f);
  }
  return out;
}

const FaultInjection& FaultInjection::from_env() {
  static const FaultInjection parsed = [] {
    const char* s = std::getenv(kEnv);
    return parse(s ? s : "");
  }();
  return parsed;
}

bool FaultInjection::nonfinite_grad_due(int64_t step, int rank) const {
  for (const Fault& f : faults)
    if (f.kind == "nonfinite_grad" && f.rank == rank && step >= f.step && step < f.step + f.count)
      return true;
  return false;
}

int64_t FaultInjection::slow_arank_seconds(int rank) const {
  int64_t s = 0;
  for (const Fault& f : faults)
    if (f.kind == "slow_arank" && f.rank == rank) s += f.seconds;
  return s;
}

std::string FaultInjection::describe() const {
  std::ostringstream os;
  for (size_t i = 0; i < faults.size(); ++i) {
    const Fault& f = faults[i];
    if (f.kind == "slow_save") {
      os << (i ? "; " : "") << "slow_save on rank " << f.rank << ": +" << f.seconds << " s in the save"
         << (f.step ? " of step " + std::to_string(f.step) : std::string());
      continue;
    }
    if (f.kind == "slow_arank") {
      os << (i ? "; " : "") << "slow_arank on rank " << f.rank << ": +" << f.seconds << " s";
      continue;
    }
    os << (i ? "; " : "") << f.kind << " on rank " << f.rank << " at step " << f.step;
    if (f.count > 1) os << ".." << f.step + f.count - 1;
  }
  return os.str();
}

at::Tensor inject_faults_into_loss(const at::Tensor& loss, int64_t step, int rank) {
  const FaultInjection& fi = FaultInjection::from_env();
  if (fi.empty() || !fi.nonfinite_grad_due(step, rank)) return loss;
  static int64_t reported = 0;  // one line per step, not per micro-batch
  if (reported != step)
    std::cerr << "gmod: fault injection: non-finite gradient on rank " << rank << " at step " << step << " ("
              << FaultInjection::kEnv << ")\n";
  reported = step;
  return loss * std::numeric_limits<double>::quiet_NaN();
}

int64_t FaultInjection::slow_save_seconds(int64_t step, int rank) const {
  int64_t s = 0;
  for (const Fault& f : faults)
    if (f.kind == "slow_save" && f.rank == rank && (f.step == 0 || f.step == step)) s += f.seconds;
  return s;
}

void inject_save_delay(int64_t step, int rank) {
  const int64_t s = FaultInjection::from_env().slow_save_seconds(step, rank);
  if (s <= 0) return;
  const std::string line = "gmod: fault injection: the save of step " + std::to_string(step) + " on rank " +
                           std::to_string(rank) + " waits " + std::to_string(s) + " s after writing its files (" +
                           FaultInjection::kEnv + ")\n";
  std::cerr << line << std::flush;
  std::this_thread::sleep_for(std::chrono::seconds(s));
}

void inject_arank_delay(int rank) {
  const int64_t s = FaultInjection::from_env().slow_arank_seconds(rank);
  if (s <= 0) return;
  // One write, so that the line is not interleaved with the other output of the rank.
  const std::string line = "gmod: fault injection: ARank on rank " + std::to_string(rank) + " takes " +
                           std::to_string(s) + " s longer (" + FaultInjection::kEnv + ")\n";
  std::cerr << line << std::flush;
  std::this_thread::sleep_for(std::chrono::seconds(s));
}

}  // namespace gmod

// Text and JSON renderings of a MemoryPlan (what `gmod plan` prints), apart from the arithmetic in
// memory_plan.cpp.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "trainer/plan/memory_plan.h"

namespace gmod {
using json = nlohmann::json;

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(b) >= 1024.0 && u < 4) b /= 1024.0, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, units[u]);
  return buf;
}

json to_json(const MemoryPlan& p) {
  json terms = json::object(), phases = json::object(), comm = json::object();
  for (const auto& t : p.terms) terms[t.name] = t.bytes;
  for (const auto& ph : p.phases) phases[ph.name] = ph.bytes;
  for (const auto& c : p.comm) comm[c.name] = c.bytes;
  json host = json::object();
  for (const auto& t : p.host_terms) host[t.name] = t.bytes;
  json j = {
      {"params",
       {{"total", p.params_total},
        {"trainable", p.params_trainable},
        {"trainable_padded", p.params_padded},
        {"frozen", p.params_frozen}}},
      {"terms", terms},
      {"total_bytes", p.total},
      {"peak_phase", p.peak_phase},
      {"phases", phases},
      {"activations_saved_bytes", p.activations_saved},
      {"cuda_reserved_lag_bytes", p.cuda_reserved_lag_bytes},
      {"host", {{"total_bytes", p.host_total}, {"terms", host}}},
      {"comm_per_step",
       {{"payload_bytes", p.comm_payload_bytes}, {"wire_bytes", p.comm_wire_bytes}, {"collectives", comm}}}};
  if (p.has_budget) {
    j["budget_bytes"] = p.budget_bytes;
    j["reserve_bytes"] = p.reserve_bytes;
    j["fits"] = p.fits;
  }
  return j;
}

std::string format_plan(const MemoryPlan& p) {
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "parameters: %lld total, %lld trainable (%lld padded), %lld frozen\n",
                (long long)p.params_total, (long long)p.params_trainable, (long long)p.params_padded,
                (long long)p.params_frozen);
  os << line << "\nper-rank memory at the peak (" << p.peak_phase << "):\n";
  for (const auto& t : p.terms) {
    if (t.bytes == 0) continue;
    std::snprintf(line, sizeof line, "  %-26s %12s  %s\n", t.name.c_str(),
                  format_bytes(double(t.bytes)).c_str(), t.what.c_str());
    os << line;
  }
  std::snprintf(line, sizeof line, "  %-26s %12s\n", "total", format_bytes(double(p.total)).c_str());
  os << line << "\nphases:\n";
  for (const auto& ph : p.phases) {
    std::snprintf(line, sizeof line, "  %-26s %12s%s\n", ph.name.c_str(),
                  format_bytes(double(ph.bytes)).c_str(), ph.name == p.peak_phase ? "  <- peak" : "");
    os << line;
  }
  std::snprintf(line, sizeof line, "  (activations saved without checkpointing: %s)\n",
                format_bytes(double(p.activations_saved)).c_str());
  if (p.cuda_reserved_lag_bytes > 0) {
    os << line;
    std::snprintf(line, sizeof line,
                  "  (CUDA reserved may exceed the total by up to %s while reductions lag the backward:\n"
                  "   blocks freed at enqueue stay reserved until the communication stream passes them)\n",
                  format_bytes(double(p.cuda_reserved_lag_bytes)).c_str());
  }
  if (!p.host_terms.empty()) {
    os << line << "\nhost memory per rank (not in the total above):\n";
    for (const auto& t : p.host_terms) {
      if (t.bytes == 0) continue;
      std::snprintf(line, sizeof line, "  %-26s %12s  %s\n", t.name.c_str(),
                    format_bytes(double(t.bytes)).c_str(), t.what.c_str());
      os << line;
    }
    std::snprintf(line, sizeof line, "  %-26s %12s\n", "host total",
                  format_bytes(double(p.host_total)).c_str());
  }
  os << line << "\ncommunication per optimizer step (per rank):\n";
  for (const auto& c : p.comm) {
    std::snprintf(line, sizeof line, "  %-26s %12s  %s\n", c.name.c_str(),
                  format_bytes(double(c.bytes)).c_str(), c.what.c_str());
    os << line;
  }
  std::snprintf(line, sizeof line, "  %-26s %12s  (ring estimate of what one rank sends)\n", "wire",
                format_bytes(p.comm_wire_bytes).c_str());
  os << line;
  if (p.has_budget) {
    std::snprintf(line, sizeof line, "\nbudget %s, reserve %s: %s (%s + %s %s %s)\n",
                  format_bytes(p.budget_bytes).c_str(), format_bytes(p.reserve_bytes).c_str(),
                  p.fits ? "fits" : "does NOT fit", format_bytes(double(p.total)).c_str(),
                  format_bytes(p.reserve_bytes).c_str(), p.fits ? "<=" : ">",
                  format_bytes(p.budget_bytes).c_str());
    os << line;
  }
  return os.str();
}

}  // namespace gmod

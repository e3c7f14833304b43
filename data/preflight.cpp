// The data guard: shared preparation of the first records of the order, counts summed over ranks, one verdict.
#include "data/preflight.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>

namespace gmod {
namespace {

std::string counts_text(const std::map<std::string, int64_t>& by_reason) {
  std::string s;
  for (const auto& [reason, n] : by_reason) s += (s.empty() ? "" : ", ") + reason + ": " + std::to_string(n);
  return s;
}

std::string percent(int64_t part, int64_t whole) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", whole > 0 ? 100.0 * double(part) / double(whole) : 0.0);
  return buf;
}

}  // namespace

std::string PreflightReport::summary() const {
  std::string s = data_path + ": the first " + std::to_string(checked) + " of " + std::to_string(records) +
                  " records in " + order_name + " checked: " + std::to_string(usable) + " usable";
  if (bad() > 0) s += ", " + std::to_string(bad()) + " not (" + counts_text(bad_by_reason) + ")";
  return s;
}

PreflightReport preflight_check(const Dataset& ds, const std::vector<size_t>& order, const PreflightOptions& o,
                                const SumOverRanks& sum) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
    throw std::invalid_argument("preflight_check: rank " + std::to_string(o.rank) + " of world size " +
                                std::to_string(o.world_size));
  if (o.records == 0 || o.records < -1)
    throw std::invalid_argument("preflight_check: records must be -1 (all) or >= 1, got " + std::to_string(o.records));
  PreflightReport rep;
  rep.data_path = ds.config().data_path;
  rep.order_name = o.order_name;
  rep.records = int64_t(ds.size());
  const int64_t n = o.records < 0 ? int64_t(order.size()) : std::min<int64_t>(o.records, int64_t(order.size()));

  // This rank's positions: k = rank, rank + world, ...; each thread takes every workers-th of them.
  std::vector<int64_t> mine;
  for (int64_t k = o.rank; k < n; k += o.world_size) mine.push_back(k);
  std::vector<BadRecord> bad(mine.size());
  std::vector<char> ok(mine.size(), 0);
  const int threads = int(std::max<int64_t>(1, std::min<int64_t>(o.workers, int64_t(mine.size()))));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (size_t i = size_t(t); i < mine.size(); i += size_t(threads)) {
        PreparedSample s;
        ok[i] = ds.try_prepare(order[size_t(mine[i])], s, bad[i]) ? 1 : 0;
      }
    });
  for (auto& th : pool) th.join();

  // [checked, usable, one count per known reason, other]
  const auto& reasons = sample_error_reasons();
  std::vector<double> counts(3 + reasons.size(), 0.0);
  for (size_t i = 0; i < mine.size(); ++i) {
    counts[0] += 1;
    if (ok[i]) {
      counts[1] += 1;
      continue;
    }
    const auto it = std::find(reasons.begin(), reasons.end(), bad[i].reason);
    counts[2 + size_t(it - reasons.begin())] += 1;  // it == end: "other"
  }
  if (sum) sum(counts);
  rep.checked = int64_t(std::llround(counts[0]));
  rep.usable = int64_t(std::llround(counts[1]));
  for (size_t r = 0; r <= reasons.size(); ++r)
    if (const int64_t c = int64_t(std::llround(counts[2 + r])); c > 0)
      rep.bad_by_reason[r < reasons.size() ? reasons[r] : "other"] = c;

  const bool none_usable = rep.usable == 0;
  const bool too_many = !(double(rep.bad()) <= o.max_bad_fraction * double(rep.checked));  // NaN fails closed
  rep.passed = !none_usable && !too_many;
  if (rep.passed) return rep;

  if (o.rank == 0 && rep.checked > 0) {
    // One example per reason, the first in order whatever the world size: positions in order, this rank's from its
    // results, the others' prepared again, until every reason has one (only on failure, at most n records).
    std::map<std::string, std::pair<int64_t, std::string>> first;  // reason -> (position, message)
    auto complete = [&] {
      for (const auto& [reason, c] : rep.bad_by_reason)
        if (!first.count(reason)) return false;
      return true;
    };
    for (int64_t k = 0; k < n && !complete(); ++k) {
      BadRecord b;
      bool good;
      if (k % o.world_size == 0) {
        const size_t i = size_t(k / o.world_size);  // mine[i] == k on rank 0
        good = ok[i] != 0;
        b = bad[i];
      } else {
        PreparedSample s;
        good = ds.try_prepare(order[size_t(k)], s, b);
      }
      if (good) continue;
      const std::string reason =
          std::find(reasons.begin(), reasons.end(), b.reason) == reasons.end() ? "other" : b.reason;
      if (!first.count(reason)) first[reason] = {k, b.message};
    }
    std::vector<std::pair<int64_t, std::string>> ex;
    for (const auto& [reason, pm] : first) ex.push_back({pm.first, "[" + reason + "] " + pm.second});
    std::sort(ex.begin(), ex.end());
    for (auto& e : ex) rep.examples.push_back(std::move(e.second));
  }

  std::string& m = rep.error;
  if (rep.records == 0) {
    m = rep.data_path + ": the dataset has no records; nothing to train on";
    return rep;
  }
  m = rep.data_path + ": " + std::to_string(rep.bad()) + " of the first " + std::to_string(rep.checked) + " of " +
      std::to_string(rep.records) + " records in " + o.order_name + " are unusable (" + percent(rep.bad(), rep.checked) +
      "; " + counts_text(rep.bad_by_reason) + ")";
  char frac[32];
  std::snprintf(frac, sizeof frac, "%g", o.max_bad_fraction);
  m += none_usable ? "; none is usable, training would learn nothing"
                   : ", more than " + o.fraction_key + " = " + frac;
  if (!rep.examples.empty()) {
    m += "; first of each kind:";
    for (const auto& e : rep.examples) m += "\n  " + e;
    m += "\n";
  } else {
    m += "; ";
  }
  m += "stopped before training (run `gmod data check` for the full list)";
  return rep;
}

}  // namespace gmod

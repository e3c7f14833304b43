// Seeded permutations and LLaVA-style modality/length grouping, both independent of the world size.
#include "data/sampler.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace gmod {
namespace {

struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Unbiased integer in [0, bound) (Lemire's multiply-and-reject).
  uint64_t below(uint64_t bound) {
    unsigned __int128 m = static_cast<unsigned __int128>(next()) * bound;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < bound) {
      const uint64_t threshold = (0 - bound) % bound;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(next()) * bound;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }
};

uint64_t mix(uint64_t a, uint64_t b) {
  SplitMix64 g{a ^ (b * 0xd1b54a32d192ed03ULL)};
  g.next();
  return g.next();
}

template <typename T>
void shuffle(std::vector<T>& v, uint64_t seed) {
  SplitMix64 g{seed};
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[g.below(i)]);
}

// Shuffle, cut into groups of `group`, sort each group by |length| descending (stable, so ties keep shuffled
// order).
std::vector<std::vector<size_t>> length_groups(std::vector<size_t> idx, const std::vector<int64_t>& lengths,
                                               int64_t group, uint64_t seed) {
  shuffle(idx, seed);
  std::vector<std::vector<size_t>> out;
  for (size_t b = 0; b < idx.size(); b += static_cast<size_t>(group)) {
    std::vector<size_t> g(idx.begin() + b,
                          idx.begin() + std::min(idx.size(), b + static_cast<size_t>(group)));
    std::stable_sort(g.begin(), g.end(),
                     [&](size_t x, size_t y) { return std::llabs(lengths[x]) > std::llabs(lengths[y]); });
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace

nlohmann::json to_json(const DataPosition& p) {
  return nlohmann::json{{"epoch", p.epoch}, {"consumed_samples", p.consumed_samples}};
}

DataPosition data_position_from_json(const nlohmann::json& j) {
  DataPosition p;
  if (!j.is_object() || !j.contains("epoch") || !j.contains("consumed_samples") ||
      !j["epoch"].is_number_integer() || !j["consumed_samples"].is_number_integer())
    throw std::runtime_error("data position: expected {\"epoch\": int, \"consumed_samples\": int}, got " +
                             j.dump());
  p.epoch = j["epoch"].get<int64_t>();
  p.consumed_samples = j["consumed_samples"].get<int64_t>();
  if (p.epoch < 0 || p.consumed_samples < 0)
    throw std::runtime_error("data position: negative field in " + j.dump());
  return p;
}

std::vector<size_t> seeded_permutation(size_t n, uint64_t seed, uint64_t stream) {
  std::vector<size_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = i;
  shuffle(v, mix(seed, stream));
  return v;
}

std::vector<size_t> epoch_order(size_t num_samples, const SamplerConfig& config, int64_t epoch,
                                const std::vector<int64_t>& lengths) {
  const uint64_t e = static_cast<uint64_t>(epoch);
  if (!config.group_by_modality_length) return seeded_permutation(num_samples, config.seed, e);
  if (lengths.size() != num_samples)
    throw std::invalid_argument("epoch_order: grouping needs one length per sample (" +
                                std::to_string(lengths.size()) + " for " + std::to_string(num_samples) + ")");
  const int64_t group = config.group_size > 0 ? config.group_size : config.global_batch_size;
  if (group < 1) throw std::invalid_argument("epoch_order: group size must be >= 1");
  std::vector<size_t> mm, lang;
  for (size_t i = 0; i < num_samples; ++i) (lengths[i] > 0 ? mm : lang).push_back(i);
  const uint64_t s = mix(config.seed, e);
  std::vector<size_t> order;
  order.reserve(num_samples);
  if (mm.empty() || lang.empty()) {
    for (auto& g : length_groups(mm.empty() ? lang : mm, lengths, group, mix(s, 1)))
      order.insert(order.end(), g.begin(), g.end());
    return order;
  }
  auto mm_groups = length_groups(std::move(mm), lengths, group, mix(s, 2));
  auto lang_groups = length_groups(std::move(lang), lengths, group, mix(s, 3));
  // The last (possibly short) group of each modality goes into one final mixed group, as LLaVA does.
  std::vector<size_t> additional = mm_groups.back();
  additional.insert(additional.end(), lang_groups.back().begin(), lang_groups.back().end());
  mm_groups.pop_back();
  lang_groups.pop_back();
  std::vector<std::vector<size_t>> groups = std::move(mm_groups);
  groups.insert(groups.end(), lang_groups.begin(), lang_groups.end());
  shuffle(groups, mix(s, 4));
  for (auto& g : groups) order.insert(order.end(), g.begin(), g.end());
  std::sort(additional.begin(), additional.end());
  order.insert(order.end(), additional.begin(), additional.end());
  return order;
}

}  // namespace gmod

#include "mod/accounting.h"

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

namespace gmod {

double token_linear_flops(const LlamaConfig& c) {
  const double D = c.hidden_size, Dh = c.dim_per_head(), H = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const double F = c.intermediate_size;
  const double attn = D * H * Dh + 2.0 * D * Hkv * Dh + H * Dh * D;
  return 2.0 * (attn + 3.0 * D * F);
}

double attention_pair_flops(const LlamaConfig& c) { return 4.0 * c.num_attention_heads * c.dim_per_head(); }

ComputeReport account_compute(const std::vector<LayerTokens>& tokens, const LlamaConfig& c,
                              const std::vector<int64_t>& sample_lengths) {
  const double tf = token_linear_flops(c), pf = attention_pair_flops(c);
  std::map<int, LayerCompute> by_layer;
  for (const auto& t : tokens) {
    auto& l = by_layer[t.layer];
    l.layer = t.layer;
    l.mod = l.mod || t.attn_pairs >= 0;
    l.processed += t.processed;
    l.total += t.total;
    // Dense pairs of the entry's tokens: from the sample lengths when they add up, else one sequence.
    int64_t sum_len = 0;
    double dense_pairs = 0;
    for (auto n : sample_lengths) {
      sum_len += n;
      dense_pairs += 0.5 * static_cast<double>(n) * static_cast<double>(n + 1);
    }
    if (sum_len != t.total) dense_pairs = 0.5 * static_cast<double>(t.total) * static_cast<double>(t.total + 1);
    const double pairs = t.attn_pairs >= 0 ? static_cast<double>(t.attn_pairs) : dense_pairs;
    l.flops += tf * static_cast<double>(t.processed) + pf * pairs;
    l.dense_flops += tf * static_cast<double>(t.total) + pf * dense_pairs;
  }
  ComputeReport r;
  for (auto& [i, l] : by_layer) {
    r.layers.push_back(l);
    r.processed += l.processed;
    r.total += l.total;
    if (l.mod) {
      r.mod_processed += l.processed;
      r.mod_total += l.total;
    }
    r.flops += l.flops;
    r.dense_flops += l.dense_flops;
  }
  return r;
}

std::string ComputeReport::table() const {
  std::string out = "layer  kind   processed/total   skip     GFLOP (dense)\n";
  char buf[160];
  for (const auto& l : layers) {
    std::snprintf(buf, sizeof buf, "%5d  %-5s  %8lld/%-8lld %6.1f%%  %8.3f (%8.3f)\n", l.layer, l.mod ? "mod" : "dense",
                  static_cast<long long>(l.processed), static_cast<long long>(l.total), 100.0 * l.skip_ratio(),
                  l.flops * 1e-9, l.dense_flops * 1e-9);
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "skip ratio %.1f%% overall, %.1f%% of MoD-layer tokens; FLOPs %.1f%% of dense\n",
                100.0 * skip_ratio(), 100.0 * mod_skip_ratio(), 100.0 * flop_ratio());
  return out + buf;
}

nlohmann::json ComputeReport::to_json() const {
  nlohmann::json j;
  j["skip_ratio"] = skip_ratio();
  j["mod_skip_ratio"] = mod_skip_ratio();
  j["flops"] = flops;
  j["dense_flops"] = dense_flops;
  j["flop_ratio"] = flop_ratio();
  for (const auto& l : layers)
    j["layers"].push_back({{"layer", l.layer}, {"mod", l.mod}, {"processed", l.processed}, {"total", l.total},
                           {"skip_ratio", l.skip_ratio()}, {"flops", l.flops}, {"dense_flops", l.dense_flops}});
  return j;
}

}  // namespace gmod

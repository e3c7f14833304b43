#include "mod/arank.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace gmod {

double attention_rank(const at::Tensor& probs) {
  if (probs.dim() != 3 || probs.size(1) != probs.size(2))
    throw std::invalid_argument("attention_rank: expected probabilities [H, n, n]");
  auto a = probs.to(at::kFloat).tril().clone();  // tril is a no-op for causal maps (as the official code)
  a.diagonal(0, -2, -1).zero_();
  auto ranks = at::linalg_matrix_rank(a, std::optional<double>(), std::optional<double>(), false);  // [H]
  return ranks.to(at::kDouble).mean().item<double>();
}

ARankAccumulator::ARankAccumulator(int n) : sum_(n, 0.0), sumsq_(n, 0.0), count_(n, 0) {}

void ARankAccumulator::add(int layer, double v) {
  sum_.at(layer) += v;
  sumsq_.at(layer) += v * v;
  count_.at(layer) += 1;
}

ARankResult ARankAccumulator::result() const {
  ARankResult r;
  for (size_t i = 0; i < sum_.size(); ++i) {
    LayerARank l;
    l.layer = static_cast<int>(i);
    l.samples = count_[i];
    if (l.samples > 0) l.mean = sum_[i] / l.samples;
    if (l.samples > 1)
      l.std = std::sqrt(std::max(0.0, (sumsq_[i] - l.samples * l.mean * l.mean) / static_cast<double>(l.samples - 1)));
    r.samples = std::max(r.samples, l.samples);
    r.layers.push_back(l);
  }
  return r;
}

std::vector<double> ARankResult::means() const {
  std::vector<double> m;
  for (const auto& l : layers) m.push_back(l.mean);
  return m;
}

nlohmann::json ARankResult::to_json() const {
  nlohmann::json j;
  j["samples"] = samples;
  j["layers"] = nlohmann::json::array();
  for (const auto& l : layers)
    j["layers"].push_back({{"layer", l.layer}, {"mean", l.mean}, {"std", l.std}, {"samples", l.samples}});
  return j;
}

std::string ARankResult::table() const {
  double mx = 0;
  for (const auto& l : layers) mx = std::max(mx, l.mean);
  std::string out = "layer      ARank        std  samples\n";
  char buf[200];
  for (const auto& l : layers) {
    const int bar = mx > 0 ? static_cast<int>(std::lround(40.0 * l.mean / mx)) : 0;
    std::snprintf(buf, sizeof buf, "%5d  %9.2f  %9.2f  %7lld  %s\n", l.layer, l.mean, l.std,
                  static_cast<long long>(l.samples), std::string(bar, '#').c_str());
    out += buf;
  }
  return out;
}

void write_arank_json(const ARankResult& r, const std::string& path) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("write_arank_json: cannot open " + path);
  f << r.to_json().dump(2) << "\n";
  if (!f) throw std::runtime_error("write_arank_json: write failed for " + path);
}

ARankResult compute_arank(MultimodalLM& model, const std::vector<ModelInputs>& batches, const ARankOptions& opt) {
  auto& stack = *model.llm->layers;
  const int n_layers = static_cast<int>(stack.size());
  for (int i = 0; i < n_layers; ++i)
    if (stack[i]->is_mod())
      throw std::invalid_argument("compute_arank: layer " + std::to_string(i) + " is a MoD layer; use the dense model");
  at::NoGradGuard no_grad;
  ARankAccumulator acc(n_layers);
  int64_t seen = 0;
  for (const auto& in : batches) {
    if (opt.max_samples > 0 && seen >= opt.max_samples) break;
    const int64_t B = in.input_ids.size(0);
    const int64_t take = opt.max_samples > 0 ? std::min(B, opt.max_samples - seen) : B;
    // The model's forward, unrolled so each layer's maps are reduced before the next layer runs: the same
    // inputs (M-RoPE ids, DeepStack features) as MultimodalLM::hidden_states.
    ForwardState st;
    st.want_attn_probs = true;
    auto h = model.decoder_inputs(in, st);
    model.llm->prepare_rotary(h, st);
    std::vector<at::Tensor> valid_idx;
    for (int64_t b = 0; b < take; ++b)
      valid_idx.push_back(in.attention_mask.defined() ? in.attention_mask[b].to(at::kBool).nonzero().squeeze(1)
                                                      : at::arange(in.input_ids.size(1), at::kLong));
    for (int i = 0; i < n_layers; ++i) {
      h = stack[i]->forward(h, st, i);
      if (st.attn_probs.empty()) throw std::logic_error("compute_arank: layer " + std::to_string(i) + " gave no map");
      auto probs = st.attn_probs.back();  // [B, H, L, L] fp32
      st.attn_probs.clear();
      if (opt.on_maps) opt.on_maps(i, probs);
      for (int64_t b = 0; b < take; ++b) {
        auto idx = valid_idx[b].to(probs.device());
        acc.add(i, attention_rank(probs[b].index_select(1, idx).index_select(2, idx)));
      }
      h = model.llm->add_deepstack(h, st, static_cast<size_t>(i));
    }
    seen += take;
  }
  return acc.result();
}

}  // namespace gmod

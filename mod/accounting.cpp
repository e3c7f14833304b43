#include "mod/accounting.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace gmod {

double token_linear_flops(const LlamaConfig& c) {
  const double D = c.hidden_size, Dh = c.dim_per_head(), H = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const double F = c.intermediate_size;
  const double attn = D * H * Dh + 2.0 * D * Hkv * Dh + H * Dh * D;
  return 2.0 * (attn + 3.0 * D * F);
}

double attention_pair_flops(const LlamaConfig& c) { return 4.0 * c.num_attention_heads * c.dim_per_head(); }

namespace {

// A ConvNeXt's forward at side x side px: the stem, the 2x2/2 downsampling convs, and per block the depthwise
// k x k conv and fc1 / fc2 (C x ratio C each).
double convnext_flops(const ConvNextConfig& m, int image_side) {
  double side = double(image_side) / m.patch_size, prev = 0;
  double f = side * side * 2.0 * m.in_chans * m.patch_size * m.patch_size * m.dims[0];
  for (size_t i = 0; i < m.dims.size(); ++i) {
    const double C = m.dims[i];
    if (i > 0) side /= 2, f += side * side * 2.0 * prev * 4.0 * C;
    f += m.depths[i] * side * side * 2.0 * C * (double(m.kernel_size) * m.kernel_size + 2.0 * m.mlp_ratio * C);
    prev = C;
  }
  return f;
}

}  // namespace

double vision_tower_flops(const LlavaConfig& c) {
  if (!c.vision) return 0.0;
  const auto& v = *c.vision;
  const int n = v.num_hidden_layers;
  const int run = c.vision_feature_layer >= 0 ? c.vision_feature_layer : n + 1 + c.vision_feature_layer;
  const double P = v.num_patches(), T = v.tokens(), Dv = v.hidden_size, Iv = v.intermediate_size;
  const double patch = P * 2.0 * v.num_channels * double(v.patch_size) * v.patch_size * Dv;
  // Per layer: q/k/v/out (4 Dv^2) and fc1/fc2 (2 Dv Iv) per token; non-causal attention, T^2 pairs x 4 Dv.
  const double layer = T * 2.0 * (4.0 * Dv * Dv + 2.0 * Dv * Iv) + T * T * 4.0 * Dv;
  if (c.multipath) {  // LLaVA-HR (model/multipath_tower.h): every CLIP layer on the fast grid, no CLS, + ConvNeXt
    const auto& m = *c.multipath;
    const double Tf = c.image_seq_length();
    const double fast_layer = Tf * 2.0 * (4.0 * Dv * Dv + 2.0 * Dv * Iv) + Tf * Tf * 4.0 * Dv;
    const double slow = convnext_flops(m.slow, m.input_image_size);
    return Tf * 2.0 * v.num_channels * double(v.patch_size) * v.patch_size * Dv + n * fast_layer + slow;
  }
  if (c.mgm) {  // MGM (model/mgm_tower.h): CLIP on every crop, the ConvNeXt at image_size_aux, the mining
    const auto& m = *c.mgm;
    const double crops = m.clip_images(), Ca = m.aux_channels();
    const double region = double(m.image_size_aux) / m.aux.patch_size / m.image_grid / (v.image_size / v.patch_size);
    const double pp = region * region;  // high-resolution pixels each patch token mines
    // per token: query projection, key and value projections of its pp pixels, scores and weighted sum
    const double mining = 2.0 * Dv * Dv + pp * 2.0 * 2.0 * Ca * Dv + pp * 4.0 * Dv;
    return crops * (patch + std::max(run, 0) * layer) + convnext_flops(m.aux, m.image_size_aux) +
           crops * P * mining;
  }
  return patch + std::max(run, 0) * layer;
}

double projector_flops(const LlavaConfig& c) {
  if (!c.vision) return 0.0;
  const double Dv = c.vision->hidden_size, D = c.text.hidden_size;
  return c.image_seq_length() * 2.0 * (Dv * D + D * D);
}

ForwardShape ForwardShape::full(std::vector<int64_t> lengths, int64_t images) {
  ForwardShape s;
  s.context.assign(lengths.size(), 0);
  s.fresh = std::move(lengths);
  s.images = images;
  return s;
}

std::vector<int64_t> sample_lengths(const at::Tensor& attention_mask, int64_t B, int64_t L) {
  if (!attention_mask.defined()) return std::vector<int64_t>(size_t(B), L);
  const at::Tensor n = attention_mask.to(at::kBool).sum(1).to(at::kLong).cpu().contiguous();
  return std::vector<int64_t>(n.data_ptr<int64_t>(), n.data_ptr<int64_t>() + n.numel());
}

namespace {

// Decoder layers of one forward: dense pairs from the shape's per-sample (context, fresh) counts.
void add_decoder(ComputeReport& r, const std::vector<LayerTokens>& tokens, const LlamaConfig& c,
                 const ForwardShape& s) {
  if (s.context.size() != s.fresh.size())
    throw std::invalid_argument("ForwardShape: context and fresh must have one entry per sample");
  const double tf = token_linear_flops(c), pf = attention_pair_flops(c);
  int64_t fresh = 0;
  double dense_pairs = 0;
  for (size_t b = 0; b < s.fresh.size(); ++b) {
    const double n = double(s.fresh[b]), ctx = double(s.context[b]);
    fresh += s.fresh[b];
    dense_pairs += n * ctx + 0.5 * n * (n + 1);
  }
  std::map<int, LayerCompute> by_layer;
  for (const auto& l : r.layers) by_layer[l.layer] = l;
  for (const auto& t : tokens) {
    // The shape describes this forward's tokens; if a report does not add up (a caller that passes no shape),
    // its tokens are taken as one sequence.
    const double dp = fresh == t.total ? dense_pairs : 0.5 * double(t.total) * double(t.total + 1);
    // A MoD layer of a full-sequence forward with a known plan ran B x k_max padded rows (header).
    const bool padded =
        t.attn_pairs >= 0 && s.mod_kmax >= 0 && fresh == t.total && s.context.size() == s.fresh.size();
    const double B = double(s.fresh.size()), K = double(s.mod_kmax);
    const int64_t rows = padded ? int64_t(s.fresh.size()) * s.mod_kmax : t.processed;
    const double pairs = padded ? B * 0.5 * K * (K + 1) : t.attn_pairs >= 0 ? double(t.attn_pairs) : dp;
    auto& l = by_layer[t.layer];
    l.layer = t.layer;
    l.mod = l.mod || t.attn_pairs >= 0;
    l.processed += t.processed;
    l.computed += rows;
    l.total += t.total;
    l.attn_pairs += pairs;
    l.dense_attn_pairs += dp;
    l.linear_flops += tf * double(rows);
    l.attn_flops += pf * pairs;
    l.dense_linear_flops += tf * double(t.total);
    l.dense_attn_flops += pf * dp;
    l.flops = l.linear_flops + l.attn_flops;
    l.dense_flops = l.dense_linear_flops + l.dense_attn_flops;
  }
  r.layers.clear();
  r.processed = r.total = r.mod_processed = r.mod_total = 0;
  r.decoder_flops = r.decoder_dense_flops = 0;
  for (auto& [i, l] : by_layer) {
    r.layers.push_back(l);
    r.processed += l.processed;
    r.total += l.total;
    if (l.mod) r.mod_processed += l.processed, r.mod_total += l.total;
    r.decoder_flops += l.flops;
    r.decoder_dense_flops += l.dense_flops;
  }
}

void update_totals(ComputeReport& r) {
  const double outside = r.head_flops + r.vision_flops + r.projector_flops;
  r.flops = r.decoder_flops + outside;
  r.dense_flops = r.decoder_dense_flops + outside;
}

}  // namespace

ComputeReport account_forward(const std::vector<LayerTokens>& tokens, const LlavaConfig& c, const ForwardShape& s) {
  ComputeReport r;
  add_decoder(r, tokens, c.text, s);
  int64_t fresh = 0;
  for (auto n : s.fresh) fresh += n;
  r.head_tokens = s.head_tokens >= 0 ? s.head_tokens : fresh;
  r.images = s.images;
  r.head_flops = 2.0 * c.text.hidden_size * double(c.text.vocab_size) * double(r.head_tokens);
  r.vision_flops = double(s.images) * vision_tower_flops(c);
  r.projector_flops = double(s.images) * projector_flops(c);
  update_totals(r);
  return r;
}

ComputeReport account_compute(const std::vector<LayerTokens>& tokens, const LlamaConfig& c,
                              const std::vector<int64_t>& lengths) {
  ComputeReport r;
  add_decoder(r, tokens, c, ForwardShape::full(lengths));
  update_totals(r);
  return r;
}

void ComputeReport::add(const ComputeReport& o) {
  std::map<int, LayerCompute> by_layer;
  for (const auto& l : layers) by_layer[l.layer] = l;
  for (const auto& l : o.layers) {
    auto& t = by_layer[l.layer];
    t.layer = l.layer;
    t.mod = t.mod || l.mod;
    t.processed += l.processed, t.total += l.total, t.computed += l.computed;
    t.attn_pairs += l.attn_pairs, t.dense_attn_pairs += l.dense_attn_pairs;
    t.linear_flops += l.linear_flops, t.attn_flops += l.attn_flops;
    t.dense_linear_flops += l.dense_linear_flops, t.dense_attn_flops += l.dense_attn_flops;
    t.flops += l.flops, t.dense_flops += l.dense_flops;
  }
  layers.clear();
  for (auto& [i, l] : by_layer) layers.push_back(l);
  processed += o.processed, total += o.total;
  mod_processed += o.mod_processed, mod_total += o.mod_total;
  images += o.images, head_tokens += o.head_tokens;
  decoder_flops += o.decoder_flops, decoder_dense_flops += o.decoder_dense_flops;
  head_flops += o.head_flops, vision_flops += o.vision_flops, projector_flops += o.projector_flops;
  update_totals(*this);
}

std::string ComputeReport::table() const {
  std::string out = "layer  kind   processed/total   skip     GFLOP (dense)\n";
  char buf[200];
  for (const auto& l : layers) {
    std::snprintf(buf, sizeof buf, "%5d  %-5s  %8lld/%-8lld %6.1f%%  %8.3f (%8.3f)\n", l.layer, l.mod ? "mod" : "dense",
                  static_cast<long long>(l.processed), static_cast<long long>(l.total), 100.0 * l.skip_ratio(),
                  l.flops * 1e-9, l.dense_flops * 1e-9);
    out += buf;
  }
  if (head_flops + vision_flops + projector_flops > 0) {
    std::snprintf(buf, sizeof buf, "outside the decoder: LM head %.3f, vision tower %.3f, projector %.3f GFLOP\n",
                  head_flops * 1e-9, vision_flops * 1e-9, projector_flops * 1e-9);
    out += buf;
  }
  std::snprintf(buf, sizeof buf,
                "skip ratio %.1f%% overall, %.1f%% of MoD-layer tokens; FLOPs %.1f%% of dense (decoder %.1f%%)\n",
                100.0 * skip_ratio(), 100.0 * mod_skip_ratio(), 100.0 * flop_ratio(), 100.0 * decoder_flop_ratio());
  return out + buf;
}

nlohmann::json ComputeReport::to_json() const {
  nlohmann::json j;
  j["skip_ratio"] = skip_ratio();
  j["mod_skip_ratio"] = mod_skip_ratio();
  j["flops"] = flops;
  j["dense_flops"] = dense_flops;
  j["flop_ratio"] = flop_ratio();
  j["decoder_flops"] = decoder_flops;
  j["decoder_dense_flops"] = decoder_dense_flops;
  j["decoder_flop_ratio"] = decoder_flop_ratio();
  j["head_flops"] = head_flops;
  j["vision_flops"] = vision_flops;
  j["projector_flops"] = projector_flops;
  for (const auto& l : layers)
    j["layers"].push_back({{"layer", l.layer},
                           {"mod", l.mod},
                           {"processed", l.processed},
                           {"computed", l.computed},
                           {"total", l.total},
                           {"skip_ratio", l.skip_ratio()},
                           {"attn_pairs", l.attn_pairs},
                           {"dense_attn_pairs", l.dense_attn_pairs},
                           {"flops", l.flops},
                           {"dense_flops", l.dense_flops}});
  return j;
}

}  // namespace gmod

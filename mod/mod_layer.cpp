#include "mod/mod_layer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "mod/kept_positions.h"
#include "mod/method_registry.h"
#include "mod/token_selection.h"
#include "model/trace_range.h"
#include "model/token_roles.h"

namespace gmod {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
at::TensorOptions long_opts(at::Device d) { return at::TensorOptions().dtype(at::kLong).device(d); }
}  // namespace

RoutingMasks routing_masks(const at::Tensor& roles, const at::Tensor& key_valid, int64_t B, int64_t L,
                           ForcedKeep forced_keep, at::Device device, bool all_routable) {
  RoutingMasks m;
  m.valid = key_valid.defined() ? key_valid.to(at::kBool)
                                : at::ones({B, L}, at::TensorOptions().dtype(at::kBool).device(device));
  if (roles.defined()) {
    if (roles.dim() != 2 || roles.size(0) != B || roles.size(1) != L)
      throw std::invalid_argument("MoD layer: token_roles must be [B, L] = [" + std::to_string(B) + ", " +
                                  std::to_string(L) + "]");
    auto is = [&](TokenRole r) { return roles == static_cast<int64_t>(r); };
    m.valid = m.valid & is(TokenRole::kPad).logical_not();
    auto routable = is(TokenRole::kImage) | is(TokenRole::kSystem);
    if (forced_keep == ForcedKeep::kQuestions) routable = routable | is(TokenRole::kAnswer);
    m.routable = all_routable ? m.valid : m.valid & routable;
  } else {
    m.routable = all_routable ? m.valid : at::zeros_like(m.valid);
  }
  m.forced = m.valid & m.routable.logical_not();
  return m;
}

at::Tensor topk_capacity(const RoutingMasks& m, double skip_frac) {
  auto skip = at::floor(m.routable.sum(1).to(at::kDouble) * skip_frac).to(at::kLong);
  return m.valid.sum(1) - skip;
}

HostCapacity host_capacity(const at::Tensor& counts, double skip_frac, ForcedKeep forced_keep, bool all_routable) {
  if (counts.dim() != 2 || counts.size(1) != kHostCountColumns || !counts.device().is_cpu())
    throw std::invalid_argument("MoD layer: host_role_counts must be a [B, 4] CPU tensor (count_routing_roles)");
  auto c = counts.to(at::kLong).contiguous();
  auto a = c.accessor<int64_t, 2>();
  HostCapacity h;
  for (int64_t b = 0; b < c.size(0); ++b) {
    const int64_t valid = a[b][kCountValid];
    const int64_t routable =
        all_routable ? valid : a[b][kCountImageSystem] + (forced_keep == ForcedKeep::kQuestions ? a[b][kCountAnswer] : 0);
    // The same double arithmetic as topk_capacity, so host and device agree exactly.
    const int64_t k = valid - static_cast<int64_t>(std::floor(static_cast<double>(routable) * skip_frac));
    h.valid.push_back(valid);
    h.routable.push_back(routable);
    h.k.push_back(k);
    h.kmax = std::max(h.kmax, k);
  }
  return h;
}

void apply_official_prefix(RoutingMasks& m, int64_t L, int64_t prefix) {
  const auto pos = at::arange(L, long_opts(m.valid.device())).unsqueeze(0);  // [1, L]
  m.routable = L > prefix ? m.valid & (pos < prefix) : at::zeros_like(m.valid);
  m.forced = m.valid & m.routable.logical_not();
}

HostCapacity host_capacity(const RoutingMasks& m, double skip_frac) {
  const auto c = at::stack({m.valid.sum(1), m.routable.sum(1)}, 1).to(at::kCPU).contiguous();  // [B, 2], a sync
  const auto a = c.accessor<int64_t, 2>();
  HostCapacity h;
  for (int64_t b = 0; b < c.size(0); ++b) {
    const int64_t k = a[b][0] - static_cast<int64_t>(std::floor(static_cast<double>(a[b][1]) * skip_frac));
    h.valid.push_back(a[b][0]);
    h.routable.push_back(a[b][1]);
    h.k.push_back(k);
    h.kmax = std::max(h.kmax, k);
  }
  return h;
}

LayerTokens HostCapacity::tokens(int layer) const {
  LayerTokens t{layer, 0, 0, 0, 0};
  for (size_t b = 0; b < k.size(); ++b) {
    t.processed += k[b];
    t.total += valid[b];
    t.attn_pairs += k[b] * (k[b] + 1) / 2;
    t.routable += routable[b];
  }
  return t;
}

at::Tensor topk_key(const at::Tensor& score, const RoutingMasks& m) {
  auto s = score.to(at::kDouble);
  return at::where(m.forced, at::full_like(s, kInf), at::where(m.routable, s, at::full_like(s, -kInf)));
}

at::Tensor select_topk(const at::Tensor& score, const RoutingMasks& m, const at::Tensor& k, int64_t kmax) {
  const int64_t B = score.size(0), L = score.size(1);
  if (kmax < 0) kmax = k.numel() ? k.max().item<int64_t>() : 0;  // host sync: callers with a HostCapacity pass it
  if (kmax <= 0) return at::zeros_like(m.valid);
  auto key = topk_key(score, m);
  auto top = std::get<1>(key.topk(std::min(kmax, L), 1, /*largest=*/true, /*sorted=*/true));  // [B, kmax]
  auto take = at::arange(top.size(1), long_opts(score.device())).unsqueeze(0) < k.unsqueeze(1);
  (void)B;
  return at::zeros({B, L}, long_opts(score.device())).scatter(1, top, take.to(at::kLong)).to(at::kBool);
}

Compaction compact(const at::Tensor& selected, const at::Tensor& counts, int64_t kmax) {
  const int64_t L = selected.size(1);
  auto ar = at::arange(L, long_opts(selected.device())).unsqueeze(0);
  auto key = at::where(selected, ar, ar + L);  // selected first, each group ascending
  Compaction c;
  c.counts = counts.defined() ? counts : selected.sum(1);
  c.kmax = kmax >= 0 ? kmax : c.counts.numel() ? c.counts.max().item<int64_t>() : 0;  // host sync without kmax
  c.index = at::remainder(std::get<0>(key.sort(1)).narrow(1, 0, c.kmax), L);
  c.valid = at::arange(c.kmax, long_opts(selected.device())).unsqueeze(0) < c.counts.unsqueeze(1);
  return c;
}

namespace {
// Rows of the [B·L, D] view that index [B, K] names: index + b·L, flattened. Row-wise index_select /
// index_copy instead of gather / scatter over an index expanded to [B, K, D]: the same values (copies of
// distinct rows), but their backward is a row index_add / index_select, where the expanded gather's backward
// under deterministic CUDA is a sort of B·K·D coordinates (GBs per layer at 7B).
at::Tensor flat_rows(const at::Tensor& index, int64_t L) {
  const auto offs = at::arange(index.size(0), index.options()).mul_(L).unsqueeze(1);
  return (index + offs).reshape({-1});
}
}  // namespace

at::Tensor gather_tokens(const at::Tensor& h, const at::Tensor& index) {
  const int64_t B = h.size(0), L = h.size(1), D = h.size(-1);
  return h.reshape({B * L, D}).index_select(0, flat_rows(index, L)).view({B, index.size(1), D});
}

at::Tensor scatter_tokens(const at::Tensor& h, const Compaction& c, const at::Tensor& y) {
  const int64_t B = h.size(0), L = h.size(1), D = h.size(-1);
  const at::Tensor rows = flat_rows(c.index, L);
  const at::Tensor hf = h.reshape({B * L, D});
  // Padding slots carry an unselected token's own row, so writing them back changes nothing.
  auto src = at::where(c.valid.unsqueeze(-1), y, hf.index_select(0, rows).view({B, c.index.size(1), D}));
  return hf.index_copy(0, rows, src.reshape({-1, D}).to(h.scalar_type())).view(h.sizes());
}

at::Tensor routing_loss(const at::Tensor& logits, const at::Tensor& selected, const at::Tensor& valid) {
  auto ce = at::logsumexp(logits, -1) - logits.gather(-1, selected.to(at::kLong).unsqueeze(-1)).squeeze(-1);
  auto vm = valid.to(logits.scalar_type());
  return (ce * vm).sum() / vm.sum().clamp_min(1.0);
}

MoDDecoderLayer::MoDDecoderLayer(const DenseDecoderLayer& d, const MoDConfig& c,
                                 std::shared_ptr<GammaRouterImpl> shared, int layer_idx, bool emit)
    : shared_router(std::move(shared)), cfg(c), emit_scores(emit), method(&method_for(c.router)) {
  self_attn = register_module("self_attn", d.self_attn);
  mlp = register_module("mlp", d.mlp);
  input_layernorm = register_module("input_layernorm", d.input_layernorm);
  post_attention_layernorm = register_module("post_attention_layernorm", d.post_attention_layernorm);
  method->attach(*this, d, layer_idx);
}

std::vector<at::Tensor> MoDDecoderLayer::external_parameters() const { return method->external_parameters(*this); }

bool MoDDecoderLayer::uses_topk() const {
  // Methods with their own ranking (FastV, PyramidDrop) never select by the capacity top-k.
  if (!method->uses_topk_mode()) return false;
  return cfg.mode == RoutingMode::kTopK || (cfg.mode == RoutingMode::kAuto && is_training());
}

MoDDecoderLayer::Scores MoDDecoderLayer::score(const at::Tensor& h) const { return method->score(*this, h); }

at::Tensor MoDDecoderLayer::combine(const at::Tensor& x, const at::Tensor& a, const at::Tensor& m,
                                    const at::Tensor& w) const {
  return method->combine(cfg, x, a, m, w);
}

namespace {
// The compaction of `sel` and this layer's accounting entry. Capacity-driven selections take their counts from
// the host plan; data-dependent ones (thresholds, forced selections) read them back. Packed rows: the kept tokens
// of each row's segments come first, segment by segment, and `kept_layout` describes them.
Compaction compact_selection(const at::Tensor& sel, const RoutingStep& s, bool by_capacity,
                             std::shared_ptr<const SegmentLayout>& kept_layout) {
  Compaction c;
  const auto& st = s.st;
  const auto& masks = s.masks;
  if (s.packed) {
    std::vector<int64_t> kept = by_capacity ? s.plan.k : std::vector<int64_t>();
    if (!by_capacity) {  // data-dependent selection (inference): per-segment counts read back
      const auto n = (to_segment_view(sel, st.segment_index) & st.segment_slots).sum(1).cpu();
      kept.assign(n.data_ptr<int64_t>(), n.data_ptr<int64_t>() + n.numel());
    }
    auto lay = std::make_shared<SegmentLayout>();
    std::vector<int64_t> row_k;
    size_t i = 0;
    for (const auto& row : st.segments->rows) {
      lay->rows.emplace_back();
      int64_t sum = 0;
      for (size_t j = 0; j < row.size(); ++j, ++i) {
        if (kept[i] > 0) lay->rows.back().push_back(kept[i]);
        sum += kept[i];
      }
      row_k.push_back(sum);
    }
    const int64_t kmax = row_k.empty() ? 0 : *std::max_element(row_k.begin(), row_k.end());
    c = compact(sel, at::tensor(row_k, long_opts(at::kCPU)).to(s.h.device()), kmax);
    kept_layout = lay;
  }
  auto& tokens = s.st.tokens;
  if (by_capacity) {
    if (!s.packed) c = compact(sel, s.k_dev, s.plan.kmax);
    tokens.push_back(s.plan.tokens(s.layer_idx));
  } else if (s.packed) {
    auto stats = at::stack({c.counts.sum(), masks.valid.sum(), masks.routable.sum()}).cpu();
    auto sa = stats.accessor<int64_t, 1>();
    int64_t pairs = 0;
    for (int64_t k : kept_layout->flat_lengths()) pairs += k * (k + 1) / 2;
    tokens.push_back({s.layer_idx, sa[0], sa[1], pairs, sa[2]});
  } else {
    c = compact(sel);
    auto stats = at::stack({c.counts.sum(), masks.valid.sum(), at::floor_divide(c.counts * (c.counts + 1), 2).sum(),
                            masks.routable.sum()})
                     .cpu();
    auto sa = stats.accessor<int64_t, 1>();
    tokens.push_back({s.layer_idx, sa[0], sa[1], sa[2], sa[3]});
  }
  return c;
}
}  // namespace

// The shared mechanics; what is method-specific is asked of `method` (mod/token_selection.h).
at::Tensor MoDDecoderLayer::forward(const at::Tensor& h, ForwardState& st, int layer_idx) {
  const int64_t B = h.size(0), L = h.size(1);
  KVCache* cache = st.caches ? &(*st.caches)[layer_idx] : nullptr;
  if (cache && cache->k.defined()) return decode_step(h, st, layer_idx, *cache);
  check_within_window(self_attn->sliding_window, st.segments ? st.segments->longest_segment() : L, layer_idx);
  const bool topk = uses_topk(), packed = static_cast<bool>(st.segments);
  const auto masks = method->masks(*this, st, B, L, h.device(), layer_idx, topk);
  // Packed rows: every segment is routed as the sample it is, through a segment-major view (model/segments.h).
  RoutingMasks seg_masks;
  if (packed) {
    check_packed_routing(layer_idx);
    if (!st.segment_index.defined()) std::tie(st.segment_index, st.segment_slots) = st.segments->view_index(L, h.device());
    seg_masks = {to_segment_view(masks.valid, st.segment_index) & st.segment_slots,
                 to_segment_view(masks.routable, st.segment_index) & st.segment_slots,
                 to_segment_view(masks.forced, st.segment_index) & st.segment_slots};
  }
  TraceRange routing("gmod::mod_routing");  // router scores, selection, compaction
  auto sc = method->score(*this, h);
  // Capacity-driven counts follow from the roles alone: from the host, no device sync (mod_layer.h).
  const bool by_capacity = !forced_selection.defined() && method->capacity_driven(topk);
  HostCapacity plan;
  at::Tensor k_dev;
  if (by_capacity) {
    const int64_t n_samples = packed ? st.segments->num_segments() : B;
    if (st.host_role_counts.defined() && st.host_role_counts.size(0) != n_samples)
      throw std::invalid_argument("MoD layer " + std::to_string(layer_idx) + ": host_role_counts has " +
                                  std::to_string(st.host_role_counts.size(0)) + " rows for " +
                                  std::to_string(n_samples) + (packed ? " packed segments" : " samples"));
    if (!st.host_role_counts.defined())  // callers other than MultimodalLM::forward: count once, for every layer
      st.host_role_counts = packed ? count_segment_roles(st.token_roles, st.key_valid, B, L, *st.segments)
                                   : count_routing_roles(st.token_roles, st.key_valid, B, L);
    method->capacity(*this, st.host_role_counts, packed ? seg_masks : masks, masks, topk, plan, k_dev);
  }
  RoutingStep step{*this, h, st, layer_idx, B, L, topk, packed, masks, seg_masks, sc, plan, k_dev};
  at::Tensor sel;
  if (st.routing_pass == RoutingPass::kReplay) {  // recompute of a checkpointed layer: the first pass's tokens
    if (!st.routing_selection.defined() || st.routing_selection.sizes() != masks.valid.sizes())
      throw std::logic_error("MoD layer " + std::to_string(layer_idx) +
                             ": replayed routing_selection must be the first pass's [B, L] selection");
    sel = st.routing_selection;
  } else if (forced_selection.defined()) {
    if (forced_selection.sizes() != masks.valid.sizes())
      throw std::invalid_argument("MoD layer " + std::to_string(layer_idx) + ": forced_selection must be [B, L]");
    sel = forced_selection.to(masks.valid.device()).to(at::kBool) & masks.valid;
  } else {
    sel = method->select(step);
  }
  method->after_select(step, sel);
  if (st.routing_pass == RoutingPass::kRecord) st.routing_selection = sel;
  if (record_selection && st.routing_pass != RoutingPass::kReplay) recorded.push_back(sel);
  if (!forced_selection.defined())
    if (auto loss = method->aux_loss(step, sel); loss.defined()) st.aux_losses.push_back(loss);
  std::shared_ptr<const SegmentLayout> kept_layout;  // packed: the kept tokens' segments in the compacted rows
  const Compaction c = compact_selection(sel, step, by_capacity, kept_layout);
  routing.end();
  const at::Tensor base = method->skipped(step);  // what skipped tokens leave as
  if (c.kmax == 0) {
    if (cache) {
      const auto& w = self_attn->k_proj->weight;
      cache->k = at::zeros({B, self_attn->n_kv_heads, 0, self_attn->head_dim}, w.options().dtype(h.scalar_type()));
      cache->v = cache->k.clone();
      cache->lengths = c.counts;
    }
    method->carry_empty(*this, st, B, L, h);
    return base;
  }
  const int64_t K = c.kmax;
  auto x = gather_tokens(h, c.index);  // [B, K, D]
  auto n = sc.normed.defined() ? gather_tokens(sc.normed, c.index) : input_layernorm->forward(x);
  at::Tensor cos, sin;  // [B|1, K, Dh]
  if (!kept_mrope_tables(st, cfg, c.index, layer_idx, cos, sin)) {  // 3-D positions: the full tables' kept rows
    at::Tensor pos;                                                  // [B|1, K]
    if (cfg.rope_positions == RopePositions::kCompacted)
      pos = packed ? kept_layout->positions(K).to(h.device()) : at::arange(K, long_opts(h.device())).unsqueeze(0);
    else
      pos = st.positions.expand({B, L}).gather(1, c.index);
    std::tie(cos, sin) = st.rope->cos_sin(pos, h.scalar_type());
  }
  // Plain causal attention over the compacted rows (kept tokens first, see the header): the fused kernel, no mask.
  // Attention maps for analysis are those of the masked path, so padded rows read as "sees only itself".
  // Packed: per kept segment (the explicit path, for maps, takes their block-diagonal mask).
  auto mask = packed ? AttentionMask{at::Tensor(), kept_layout}
                     : st.want_attn_probs ? AttentionMask::causal(c.valid, K, K, 0) : AttentionMask{};
  at::Tensor probs;
  AttentionSide side;
  auto a = x + self_attn->forward(n, cos, sin, mask, st.want_attn_probs ? &probs : nullptr, cache,
                                  method->wants_attention_side(*this) ? &side : nullptr);
  if (st.want_attn_probs) st.attn_probs.push_back(probs);  // compacted [B, H, K, K]
  if (cache) cache->lengths = c.counts;
  auto m = mlp->forward(post_attention_layernorm->forward(a));
  auto y = method->combine(cfg, x, a, m, sc.weight.defined() ? sc.weight.gather(1, c.index) : at::Tensor());
  method->carry(*this, st, c, side, kept_layout.get(), B, L, h);
  return scatter_tokens(base, c, y);
}

void MoDDecoderLayer::check_packed_routing(int layer_idx) const {
  if (!method->routes_packed() || forced_selection.defined())
    throw std::invalid_argument("MoD layer " + std::to_string(layer_idx) +
                                ": packed rows (data.pack_to) are routed per segment for the γ-MoD, per-layer, "
                                "p-MoD, A-MoD and PyramidDrop routers; this layer's router (" + std::string(to_string(cfg.router)) +
                                (forced_selection.defined() ? ", with a forced selection" : "") +
                                ") needs unpacked batches (data.pack_to: 0)");
}

// decode_step: mod/mod_decode.cpp.

}  // namespace gmod

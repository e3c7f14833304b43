// The stepwise decoder of a running batch (mod/decode_batch.h).
#include "mod/decode_batch.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "model/kv_cache.h"
#include "model/mrope.h"
#include "model/token_roles.h"

namespace gmod {

namespace {
// The whole buffer behind a slot view t [R, H, T, Dh] ([R, H, C, Dh], C = kv_capacity(t)).
at::Tensor whole(const at::Tensor& t) {
  return t.as_strided({t.size(0), t.size(1), kv_capacity(t), t.size(3)}, t.strides(), t.storage_offset());
}

// t's rows `idx` (-1: a new zero row), keeping its slots and capacity: a slot view of a fresh buffer.
at::Tensor rows_of(const at::Tensor& t, const at::Tensor& idx) {
  auto buf = whole(t);
  auto pick = idx.clamp_min(0);
  auto out = buf.index_select(0, pick);
  out.masked_fill_((idx < 0).view({-1, 1, 1, 1}), 0);
  return out.narrow(2, 0, t.size(2));
}

void rows_of(KVCache& c, const at::Tensor& idx) {
  if (!c.k.defined()) return;
  c.k = rows_of(c.k, idx);
  c.v = rows_of(c.v, idx);
  if (c.lengths.defined())
    c.lengths = at::where(idx < 0, at::zeros_like(idx), c.lengths.index_select(0, idx.clamp_min(0)));
}
}  // namespace

DecodeBatch::DecodeBatch(MultimodalLM& model, DecodeBatchOptions opt)
    : model_(model),
      opt_(opt),
      context_(opt.context > 0 ? opt.context : model.config.text.max_position_embeddings) {}

int64_t DecodeBatch::active_rows() const { return std::count(active_.begin(), active_.end(), true); }

void DecodeBatch::reset() {
  caches_.clear();
  key_buf_ = positions_ = at::Tensor();
  ids_ = full_mask_ = full_positions_ = roles_ = full_mrope_ = prompt_emb_ = prompt_visual_mask_ = at::Tensor();
  prompt_deepstack_.clear();
  column_ = 0;
  active_.clear();
  context_len_.clear();
  budget_.clear();
}

bool DecodeBatch::fits(int64_t prompt_width, int64_t max_new_tokens) const {
  if (active_rows() == 0) return true;
  if (!opt_.use_cache) return false;
  const int64_t steps = std::max({max_new_tokens - 1, int64_t(0), steps_ahead()});
  return std::max(column_, prompt_width) + steps <= context_;
}

std::vector<int64_t> DecodeBatch::take_rows(int64_t n) {
  std::vector<int64_t> rows;
  for (size_t r = 0; r < active_.size() && int64_t(rows.size()) < n; ++r)
    if (!active_[r]) rows.push_back(int64_t(r));
  const int64_t R = this->rows(), grow = n - int64_t(rows.size());
  if (grow == 0) return rows;
  for (int64_t i = 0; i < grow; ++i) rows.push_back(R + i);
  active_.resize(size_t(R + grow), false);
  context_len_.resize(size_t(R + grow), 0);
  budget_.resize(size_t(R + grow), 0);
  if (R == 0) return rows;  // the first admission takes the prefill's tensors as they are
  const auto lopts = at::TensorOptions().dtype(at::kLong).device(device_);
  auto idx = at::cat({at::arange(R, lopts), at::full({grow}, -1, lopts)});
  for (auto& c : caches_) rows_of(c, idx);
  key_buf_ = at::cat({key_buf_, at::zeros({grow, key_buf_.size(1)}, key_buf_.options())});
  positions_ = at::cat({positions_, at::zeros({grow}, lopts)});
  return rows;
}

void DecodeBatch::place(const std::vector<KVCache>& fresh, const at::Tensor& mask,
                        const std::vector<int64_t>& rows) {
  const int64_t Lp = mask.size(1);
  const auto idx = at::tensor(rows, at::kLong).to(device_);
  // Room for the tokens to come, never past the context: a dense row's slots never pass the column, a MoD row's
  // never its tokens (decode steps then write in place, model/kv_cache.h).
  const int64_t steps = steps_ahead(), col = std::max(column_, Lp);
  const int64_t cap = std::max(context_, col + steps + 1);
  for (size_t l = 0; l < caches_.size(); ++l) {
    KVCache& c = caches_[l];
    if (fresh[l].lengths.defined())
      kv_reserve(c, std::min(std::max(c.length(), fresh[l].length()) + steps + 1, cap));
    else
      kv_reserve(c, col + steps + 1);
  }
  if (Lp > column_) {  // a longer joiner advances the shared column (invalid slots for the others)
    for (size_t l = 0; l < caches_.size(); ++l)
      if (!fresh[l].lengths.defined()) kv_grow(caches_[l], Lp);
    column_ = Lp;
  }
  for (size_t l = 0; l < caches_.size(); ++l) {
    KVCache& c = caches_[l];
    const KVCache& f = fresh[l];
    if (f.lengths.defined() != c.lengths.defined())
      throw std::logic_error("DecodeBatch: layer " + std::to_string(l) +
                             "'s cache kind changed between prefills");
    const int64_t n = f.length();
    if (f.lengths.defined()) {  // MoD: per-row lengths
      if (n > c.length()) kv_grow(c, n);
      c.lengths = c.lengths.index_copy(0, idx, f.lengths);
    }
    if (n == 0) continue;
    c.k.narrow(2, 0, n).index_copy_(0, idx, f.k.to(c.k.scalar_type()));
    c.v.narrow(2, 0, n).index_copy_(0, idx, f.v.to(c.v.scalar_type()));
  }
  widen_keys(column_);
  auto rows_keys = at::zeros({int64_t(rows.size()), key_buf_.size(1)}, key_buf_.options());
  rows_keys.narrow(1, 0, Lp).copy_(mask);
  key_buf_.index_copy_(0, idx, rows_keys);
}

void DecodeBatch::widen_keys(int64_t columns) {
  if (key_buf_.size(1) >= columns) return;
  auto wider = at::zeros({key_buf_.size(0), columns}, key_buf_.options());
  wider.narrow(1, 0, key_buf_.size(1)).copy_(key_buf_);
  key_buf_ = wider;
}

int64_t DecodeBatch::steps_ahead() const {
  int64_t steps = 0;
  for (size_t r = 0; r < active_.size(); ++r)
    if (active_[r]) steps = std::max(steps, budget_[r]);
  return steps;
}

void DecodeBatch::reserve_ahead() {
  const int64_t steps = steps_ahead(), cap = std::max(context_, column_ + steps + 1);
  // Room for every token still to come: decode steps write their K/V in place (model/kv_cache.h).
  for (auto& c : caches_) kv_reserve(c, c.lengths.defined() ? std::min(c.length() + steps + 1, cap) : column_ + steps + 1);
  widen_keys(column_ + steps + 1);
}

DecodeBatch::Admitted DecodeBatch::admit(const ModelInputs& prompt, int64_t max_new_tokens) {
  at::NoGradGuard no_grad;
  const int64_t B = prompt.input_ids.size(0), L = prompt.input_ids.size(1);
  const bool joining = active_rows() > 0;
  if (!joining) reset();
  if (joining && !opt_.use_cache)
    throw std::logic_error("DecodeBatch: recomputation (use_cache = false) cannot join a running batch");
  if (joining && !fits(L, max_new_tokens))
    throw std::logic_error(
        "DecodeBatch: a prompt of " + std::to_string(L) + " tokens with " + std::to_string(max_new_tokens) +
        " new tokens does not fit beside the running batch " + "(column " + std::to_string(column_) +
        ", context " + std::to_string(context_) + "); wait until it drains");
  device_ = prompt.input_ids.device();
  const auto lopts = at::TensorOptions().dtype(at::kLong).device(device_);
  auto mask = prompt.attention_mask.defined() ? prompt.attention_mask.to(at::kBool)
                                              : at::ones({B, L}, lopts.dtype(at::kBool));
  const std::vector<int64_t> prompt_len = sample_lengths(mask);
  for (auto len : prompt_len)
    if (len < 1) throw std::invalid_argument("generate: every prompt needs at least one token");
  const int64_t n_images = prompt.pixel_values.defined() ? prompt.pixel_values.size(0) : 0;
  auto n = mask.sum(1);  // each row's next position: its prompt length (M-RoPE: below)
  std::vector<KVCache> fresh(model_.llm->layers->size());
  Admitted out;
  at::Tensor mrope, positions;  // [3, B, L] M-RoPE ids (M-RoPE prompts with images or videos); [B, L]
  {
    ForwardState st;
    if (opt_.use_cache) st.caches = &fresh;
    // The forward's own inputs (MultimodalLM::decoder_inputs): positions and masks, 3-D ids from the images'
    // and videos' grids, the images and videos spliced in, DeepStack features and their positions.
    auto emb = model_.decoder_inputs(prompt, st);
    if (!opt_.use_cache && !joining) {  // the recomputing decoder reuses the prompt's spliced-in embeddings
      prompt_emb_ = emb;
      prompt_deepstack_ = st.deepstack;
      prompt_visual_mask_ = st.visual_mask;
    }
    mrope = st.mrope_positions;
    if (mrope.defined()) st.positions = mrope.select(0, 0);  // the temporal row stands for the 1-D ids
    positions = st.positions;
    auto h = model_.llm->forward(emb, st);
    const auto last_at = mask.sum(1);  // right padding: each row's last prompt token
    auto last = h.gather(1, (last_at - 1).view({B, 1, 1}).expand({B, 1, h.size(2)})).squeeze(1);
    out.logits = model_.logits(last);
    layer_tokens_.insert(layer_tokens_.end(), st.tokens.begin(), st.tokens.end());
    ForwardShape shape = ForwardShape::full(prompt_len, n_images);
    shape.head_tokens = B;  // the last prompt position of each sample
    compute_.add(account_forward(st.tokens, model_.config, shape));
  }
  // M-RoPE: the next token sits at the largest id + 1 (prompt length + rope_delta) on all three axes.
  if (mrope.defined()) n = mrope.amax(0).masked_fill(mask.logical_not(), -1).amax(1) + 1;
  out.rows = take_rows(B);
  if (!joining) {
    caches_ = std::move(fresh);
    column_ = L;
    key_buf_ = mask.clone();
    positions_ = n.clone();
    if (!opt_.use_cache) {
      ids_ = prompt.input_ids;
      full_mask_ = mask;
      full_positions_ = positions;
      roles_ = prompt.token_roles;
      full_mrope_ = mrope;
    }
  }
  for (int64_t b = 0; b < B; ++b) {
    const auto r = size_t(out.rows[size_t(b)]);
    active_[r] = true;
    context_len_[r] = prompt_len[size_t(b)];
    budget_[r] = std::max<int64_t>(max_new_tokens - 1, 0);
  }
  if (joining) {
    place(fresh, mask, out.rows);
    positions_.index_copy_(0, at::tensor(out.rows, at::kLong).to(device_), n);
  }
  if (opt_.use_cache) reserve_ahead();
  return out;
}

at::Tensor DecodeBatch::step(const at::Tensor& tokens) {
  at::NoGradGuard no_grad;
  const int64_t R = rows();
  if (R == 0) throw std::logic_error("DecodeBatch: step() on an empty batch");
  if (tokens.dim() != 1 || tokens.size(0) != R)
    throw std::invalid_argument("DecodeBatch: step() takes one token per row (" + std::to_string(R) +
                                "), got " + std::to_string(tokens.numel()));
  const auto valid = active_mask();
  const int64_t n_active = active_rows();
  auto roles =
      at::where(valid, static_cast<int64_t>(TokenRole::kAnswer), static_cast<int64_t>(TokenRole::kPad))
          .to(at::kChar)
          .unsqueeze(1);
  ForwardState st;
  ForwardShape shape;
  at::Tensor h;
  if (opt_.use_cache) {
    if (key_buf_.size(1) <= column_) widen_keys(2 * column_ + 1);  // past the reserve (stepping beyond its budget)
    key_buf_.select(1, column_).copy_(valid);
    const int64_t T = column_ + 1;
    auto key_hist = key_buf_.narrow(1, 0, T);
    st.positions = positions_.unsqueeze(1);
    st.key_valid = key_hist;
    st.mask = AttentionMask::causal(key_hist, 1, T, T - 1);
    st.token_roles = roles;
    st.valid_tokens = n_active;
    st.caches = &caches_;
    h = model_.llm->forward(model_.llm->embed(tokens.unsqueeze(1)), st).select(1, 0);
    // Dense reference: the new token attends to the row's prompt and the tokens generated before it.
    for (int64_t r = 0; r < R; ++r) {
      shape.fresh.push_back(active_[size_t(r)] ? 1 : 0);
      shape.context.push_back(active_[size_t(r)] ? context_len_[size_t(r)] : 0);
    }
    ++column_;
  } else {
    h = recompute_step(tokens, valid, roles, st);
    // The decoder recomputes every token; the vision encoder ran once, in the prefill.
    shape = ForwardShape::full(sample_lengths(full_mask_), 0);
  }
  auto logits = model_.logits(h);
  shape.head_tokens = n_active;
  layer_tokens_.insert(layer_tokens_.end(), st.tokens.begin(), st.tokens.end());
  compute_.add(account_forward(st.tokens, model_.config, shape));
  positions_ = positions_ + 1;
  for (size_t r = 0; r < active_.size(); ++r)
    if (active_[r]) {
      ++context_len_[r];
      budget_[r] = std::max<int64_t>(budget_[r] - 1, 0);
    }
  return logits;
}

int64_t DecodeBatch::kv_bytes() const {
  if (!opt_.use_cache || active_rows() == 0) return 0;
  const auto act = active_mask();
  int64_t bytes = 0, dense_entries = -1;  // the dense layers' count, computed once
  for (const KVCache& c : caches_) {
    if (!c.k.defined() || c.k.size(2) == 0) continue;
    const int64_t per_entry = c.k.size(1) * c.k.size(3) * c.k.element_size() + c.v.size(1) * c.v.size(3) * c.v.element_size();
    int64_t entries;
    if (c.lengths.defined()) {
      entries = c.lengths.masked_select(act).sum().item<int64_t>();
    } else {
      if (dense_entries < 0)
        dense_entries = key_buf_.narrow(1, 0, column_).logical_and(act.unsqueeze(1)).sum().item<int64_t>();
      entries = dense_entries;
    }
    bytes += entries * per_entry;
  }
  return bytes;
}

at::Tensor DecodeBatch::active_mask() const {
  std::vector<int64_t> a(active_.begin(), active_.end());
  return at::tensor(a, at::kLong).to(device_).to(at::kBool);
}

at::Tensor DecodeBatch::recompute_step(const at::Tensor& tokens, const at::Tensor& valid,
                                       const at::Tensor& step_roles, ForwardState& st) {
  ids_ = at::cat({ids_, tokens.unsqueeze(1)}, 1);
  full_mask_ = at::cat({full_mask_, valid.unsqueeze(1)}, 1);
  full_positions_ = at::cat({full_positions_, positions_.unsqueeze(1)}, 1);
  if (full_mrope_.defined())  // the new token: text, the same id on all three axes
    full_mrope_ = at::cat({full_mrope_, positions_.view({1, -1, 1}).expand({3, -1, 1})}, 2);
  if (roles_.defined()) roles_ = at::cat({roles_, step_roles}, 1);
  prepare_forward_state(st, ids_, full_mask_, full_positions_);
  st.mrope_positions = full_mrope_;
  st.token_roles = roles_;
  // The prompt's embeddings as its prefill made them (images and videos spliced in, the encoder not run again), then
  // the generated tokens as text: a generated id that equals an image or video token's is text, as in transformers'
  // generate. DeepStack features stay at the prompt's visual positions.
  const int64_t P = prompt_emb_.size(1), T = ids_.size(1);
  auto emb = at::cat({prompt_emb_, model_.llm->embed(ids_.narrow(1, P, T - P)).to(prompt_emb_.scalar_type())}, 1);
  st.deepstack = prompt_deepstack_;
  if (prompt_visual_mask_.defined())
    st.visual_mask = at::cat({prompt_visual_mask_, at::zeros({T - P}, prompt_visual_mask_.options())
                                                       .unsqueeze(0)
                                                       .expand({prompt_visual_mask_.size(0), T - P})},
                             1);
  return model_.llm->forward(emb, st).select(1, T - 1);
}

void DecodeBatch::release(int64_t row) {
  if (row < 0 || row >= rows() || !active_[size_t(row)])
    throw std::invalid_argument("DecodeBatch: release of row " + std::to_string(row) +
                                ", which is not active");
  active_[size_t(row)] = false;
  budget_[size_t(row)] = 0;
  if (active_rows() == 0) reset();  // drained: the column starts again at the next admission
}

std::vector<int64_t> DecodeBatch::compact() {
  std::vector<int64_t> map(active_.size(), -1), keep;
  for (size_t r = 0; r < active_.size(); ++r)
    if (active_[r]) {
      map[r] = int64_t(keep.size());
      keep.push_back(int64_t(r));
    }
  if (keep.size() == active_.size()) return map;
  if (!opt_.use_cache) throw std::logic_error("DecodeBatch: compact() needs the KV caches (use_cache)");
  const auto idx = at::tensor(keep, at::kLong).to(device_);
  for (auto& c : caches_) rows_of(c, idx);
  key_buf_ = key_buf_.index_select(0, idx);
  positions_ = positions_.index_select(0, idx);
  std::vector<bool> a;
  std::vector<int64_t> cl, bu;
  for (auto r : keep) {
    a.push_back(true);
    cl.push_back(context_len_[size_t(r)]);
    bu.push_back(budget_[size_t(r)]);
  }
  active_ = a;
  context_len_ = cl;
  budget_ = bu;
  return map;
}

}  // namespace gmod

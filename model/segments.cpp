#include "model/segments.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace gmod {

int64_t SegmentLayout::num_segments() const {
  int64_t n = 0;
  for (const auto& r : rows) n += static_cast<int64_t>(r.size());
  return n;
}

int64_t SegmentLayout::longest_segment() const {
  int64_t m = 0;
  for (const auto& r : rows)
    for (int64_t len : r) m = std::max(m, len);
  return m;
}

int64_t SegmentLayout::row_length(int64_t r) const {
  int64_t n = 0;
  for (int64_t len : rows.at(static_cast<size_t>(r))) n += len;
  return n;
}

std::vector<int64_t> SegmentLayout::flat_lengths() const {
  std::vector<int64_t> out;
  for (const auto& r : rows) out.insert(out.end(), r.begin(), r.end());
  return out;
}

void SegmentLayout::check(int64_t B, int64_t L, const char* what) const {
  if (num_rows() != B)
    throw std::invalid_argument(std::string(what) + ": segment layout has " + std::to_string(num_rows()) +
                                " rows for a batch of " + std::to_string(B));
  for (int64_t r = 0; r < B; ++r) {
    for (int64_t len : rows[static_cast<size_t>(r)])
      if (len < 1)
        throw std::invalid_argument(std::string(what) + ": row " + std::to_string(r) + " has an empty segment");
    if (row_length(r) > L)
      throw std::invalid_argument(std::string(what) + ": row " + std::to_string(r) + "'s segments cover " +
                                  std::to_string(row_length(r)) + " tokens, more than the row's " + std::to_string(L));
  }
}

at::Tensor SegmentLayout::positions(int64_t L) const {
  auto p = at::empty({num_rows(), L}, at::kLong);
  auto a = p.accessor<int64_t, 2>();
  for (int64_t r = 0; r < num_rows(); ++r) {
    int64_t t = 0;
    for (int64_t len : rows[static_cast<size_t>(r)])
      for (int64_t i = 0; i < len; ++i) a[r][t++] = i;
    for (int64_t i = 0; t < L; ++i) a[r][t++] = i;
  }
  return p;
}

std::pair<at::Tensor, at::Tensor> SegmentLayout::view_index(int64_t L, at::Device device) const {
  const int64_t S = num_segments(), M = std::max<int64_t>(longest_segment(), 1);
  auto idx = at::empty({S, M}, at::kLong);
  auto ok = at::zeros({S, M}, at::kBool);
  auto ia = idx.accessor<int64_t, 2>();
  auto oa = ok.accessor<bool, 2>();
  int64_t s = 0;
  for (int64_t r = 0; r < num_rows(); ++r) {
    int64_t start = 0;
    for (int64_t len : rows[static_cast<size_t>(r)]) {
      for (int64_t i = 0; i < M; ++i) {
        const bool in = i < len;
        ia[s][i] = r * L + (in ? start + i : 0);
        oa[s][i] = in;
      }
      start += len;
      ++s;
    }
  }
  return {idx.to(device), ok.to(device)};
}

at::Tensor SegmentLayout::block_causal_mask(int64_t L, at::Device device) const {
  // Segment number per position (padding: its own number past the last segment), then same-segment & causal.
  auto seg = at::empty({num_rows(), L}, at::kLong);
  auto a = seg.accessor<int64_t, 2>();
  for (int64_t r = 0; r < num_rows(); ++r) {
    int64_t t = 0, s = 0;
    for (int64_t len : rows[static_cast<size_t>(r)]) {
      for (int64_t i = 0; i < len; ++i) a[r][t++] = s;
      ++s;
    }
    for (; t < L; ++t) a[r][t] = s + t;  // each padding position alone: it sees itself only
  }
  auto sd = seg.to(device);
  auto same = sd.unsqueeze(2) == sd.unsqueeze(1);  // [B, L, L]
  auto ar = at::arange(L, at::TensorOptions().dtype(at::kLong).device(device));
  auto causal = ar.unsqueeze(0) <= ar.unsqueeze(1);  // [L(q), L(k)]
  return (same & causal.unsqueeze(0)).unsqueeze(1);
}

at::Tensor to_segment_view(const at::Tensor& x, const at::Tensor& view_index) {
  const int64_t B = x.size(0), L = x.size(1);
  std::vector<int64_t> flat{B * L}, out{view_index.size(0), view_index.size(1)};
  for (int64_t d = 2; d < x.dim(); ++d) {
    flat.push_back(x.size(d));
    out.push_back(x.size(d));
  }
  return x.reshape(flat).index_select(0, view_index.reshape({-1})).view(out);
}

at::Tensor from_segment_view(const at::Tensor& v, const at::Tensor& view_index, const at::Tensor& slot_valid,
                             const at::Tensor& base) {
  const auto keep = slot_valid.reshape({-1});
  return base.reshape({-1})
      .index_put({view_index.reshape({-1}).masked_select(keep)}, v.reshape({-1}).masked_select(keep))
      .view(base.sizes());
}

}  // namespace gmod

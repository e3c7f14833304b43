// Packed rows: several samples ("segments") laid end to end in one row of a [B, L] batch (data.pack_to,
// data/pack.h). The layout is known on the host, so attention can run per segment through the fused causal kernel
// (no [L, L] mask), positions restart at 0 per segment, and MoD layers route each segment as the sample it is
// (its own capacity and top-k) without reading anything back from the device.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <utility>
#include <vector>

namespace gmod {

struct SegmentLayout {
  // Per row, the lengths of its segments in order from position 0; whatever follows the last one is padding.
  std::vector<std::vector<int64_t>> rows;

  int64_t num_rows() const { return static_cast<int64_t>(rows.size()); }
  int64_t num_segments() const;
  int64_t longest_segment() const;
  int64_t row_length(int64_t r) const;  // tokens covered by segments
  std::vector<int64_t> flat_lengths() const;  // every segment's length, row-major
  // Throws std::invalid_argument naming `what` when the layout does not fit a [B, L] batch or has an empty segment.
  void check(int64_t B, int64_t L, const char* what) const;

  // Position ids [B, L] int64 (CPU): 0.. within each segment, 0.. again over a row's trailing padding.
  at::Tensor positions(int64_t L) const;
  // Segment-major view of a [B, L] batch: index [S, Lmax] int64 of flat positions b·L + t (padding slots point at
  // position 0 of their row) and slot validity [S, Lmax] bool, on `device`.
  std::pair<at::Tensor, at::Tensor> view_index(int64_t L, at::Device device) const;
  // Block-diagonal causal mask [B, 1, L, L] bool for the explicit attention path (attention maps); a padding query
  // sees itself only.
  at::Tensor block_causal_mask(int64_t L, at::Device device) const;
};

// A [B, L, ...] tensor viewed per segment: [S, Lmax, ...]; slots past a segment's end hold position 0 of its row.
at::Tensor to_segment_view(const at::Tensor& x, const at::Tensor& view_index);
// The inverse for [B, L] values: `base` with each segment's valid slots of `v` [S, Lmax] written back.
at::Tensor from_segment_view(const at::Tensor& v, const at::Tensor& view_index, const at::Tensor& slot_valid,
                             const at::Tensor& base);

}  // namespace gmod

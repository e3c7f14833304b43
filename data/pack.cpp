#include "data/pack.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace gmod {

std::vector<std::vector<size_t>> pack_first_fit_decreasing(const std::vector<int64_t>& lengths, int64_t budget) {
  if (budget < 1) throw std::invalid_argument("packing: budget must be >= 1, got " + std::to_string(budget));
  for (size_t i = 0; i < lengths.size(); ++i)
    if (lengths[i] < 1 || lengths[i] > budget)
      throw std::invalid_argument("packing: sample " + std::to_string(i) + " has " + std::to_string(lengths[i]) +
                                  " tokens, outside [1, " + std::to_string(budget) + "]");
  std::vector<size_t> order(lengths.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lengths[a] > lengths[b]; });
  std::vector<std::vector<size_t>> rows;
  std::vector<int64_t> room;
  for (size_t i : order) {
    size_t r = 0;
    while (r < rows.size() && room[r] < lengths[i]) ++r;
    if (r == rows.size()) {
      rows.emplace_back();
      room.push_back(budget);
    }
    rows[r].push_back(i);
    room[r] -= lengths[i];
  }
  return rows;
}

Batch collate_packed(std::vector<PreparedSample>& samples, int32_t pad_id, int image_size, int64_t pack_to) {
  std::vector<int64_t> lengths;
  lengths.reserve(samples.size());
  for (const auto& s : samples) {
    const auto n = static_cast<int64_t>(s.sample.ids.size());
    if (n > pack_to)
      throw std::runtime_error("packing: record " + std::to_string(s.sample.index) + " (id \"" + s.sample.id +
                               "\") has " + std::to_string(n) + " tokens, more than data.pack_to = " +
                               std::to_string(pack_to) + " (raise data.pack_to or set data.max_len <= it)");
    if (n == 0)
      throw std::runtime_error("packing: record " + std::to_string(s.sample.index) + " (id \"" + s.sample.id +
                               "\") has no tokens");
    lengths.push_back(n);
  }
  auto rows = pack_first_fit_decreasing(lengths, pack_to);
  // Never more positions than padding: rows x longest row against samples x longest sample (a window of a few long
  // samples and one short one can pack worse); then one sample per row, so a packed micro-batch never computes more
  // than the padded one and `gmod plan`'s padded worst case (micro_batch x max_len) holds for it.
  int64_t longest_row = 0, longest = 0;
  for (const auto& row : rows) {
    int64_t n = 0;
    for (size_t i : row) n += lengths[i], longest = std::max(longest, lengths[i]);
    longest_row = std::max(longest_row, n);
  }
  if (static_cast<int64_t>(rows.size()) * longest_row > static_cast<int64_t>(lengths.size()) * longest) {
    rows.assign(lengths.size(), {});
    for (size_t i = 0; i < lengths.size(); ++i) rows[i] = {i};
  }
  // Collate the samples in row-major placement order, then lay each row's samples end to end.
  std::vector<PreparedSample> ordered;
  ordered.reserve(samples.size());
  auto layout = std::make_shared<SegmentLayout>();
  int64_t L = 0;
  for (const auto& row : rows) {
    layout->rows.emplace_back();
    int64_t len = 0;
    for (size_t i : row) {
      ordered.push_back(std::move(samples[i]));
      layout->rows.back().push_back(lengths[i]);
      len += lengths[i];
    }
    L = std::max(L, len);
  }
  samples.clear();
  Batch one = collate(ordered, pad_id, image_size);  // one sample per row: the per-sample copies, images in order
  const int64_t R = static_cast<int64_t>(rows.size());
  Batch b;
  b.input_ids = at::full({R, L}, pad_id, at::kLong);
  b.labels = at::full({R, L}, kIgnoreIndex, at::kLong);
  b.attention_mask = at::zeros({R, L}, at::kBool);
  b.token_roles = at::full({R, L}, static_cast<int8_t>(TokenRole::kPad), at::kChar);
  int64_t s = 0;
  for (int64_t r = 0; r < R; ++r) {
    int64_t start = 0;
    for (int64_t len : layout->rows[static_cast<size_t>(r)]) {
      b.input_ids[r].narrow(0, start, len).copy_(one.input_ids[s].narrow(0, 0, len));
      b.labels[r].narrow(0, start, len).copy_(one.labels[s].narrow(0, 0, len));
      b.labels[r][start] = kIgnoreIndex;
      b.attention_mask[r].narrow(0, start, len).fill_(true);
      b.token_roles[r].narrow(0, start, len).copy_(one.token_roles[s].narrow(0, 0, len));
      start += len;
      ++s;
    }
  }
  b.pixel_values = one.pixel_values;
  // Native-resolution images: their grids in the same (segment) order; the model computes each segment's M-RoPE ids
  // from them as its own sample's (MultimodalLM::hidden_states).
  b.image_grid_thw = one.image_grid_thw;
  b.image_sizes = one.image_sizes;  // AnyRes: each image's size in the same order as its tiles
  b.pixel_values_videos = one.pixel_values_videos;  // videos likewise (segment order)
  b.video_grid_thw = one.video_grid_thw;
  b.second_per_grid_ts = one.second_per_grid_ts;
  b.positions = layout->positions(L);
  b.segments = layout;
  b.indices = std::move(one.indices);
  b.ids = std::move(one.ids);
  b.tokens = one.tokens;
  b.truncated = one.truncated;
  return b;
}

}  // namespace gmod

#include "model/mrope.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace gmod {

namespace {

std::string grid_text(int64_t t, int64_t h, int64_t w) {
  return "(" + std::to_string(t) + ", " + std::to_string(h) + ", " + std::to_string(w) + ")";
}

}  // namespace

MRopePositions mrope_positions(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                               const at::Tensor& image_grid_thw, const at::Tensor& video_grid_thw,
                               const at::Tensor& second_per_grid_ts, const MRopeConfig& c) {
  if (input_ids.dim() != 2) throw std::invalid_argument("mrope_positions: input_ids must be [B, L]");
  const int64_t B = input_ids.size(0), L = input_ids.size(1), m = c.spatial_merge_size;
  auto ids = input_ids.to(at::kCPU, at::kLong).contiguous();
  auto mask = attention_mask.defined() ? attention_mask.to(at::kCPU).to(at::kBool).contiguous()
                                       : at::ones({B, L}, at::kBool);
  auto grids = [](const at::Tensor& g) {
    return g.defined() ? g.to(at::kCPU, at::kLong).contiguous().view({-1, 3}) : at::zeros({0, 3}, at::kLong);
  };
  const at::Tensor gi = grids(image_grid_thw), gv = grids(video_grid_thw);
  at::Tensor secs = second_per_grid_ts.defined() ? second_per_grid_ts.to(at::kCPU, at::kFloat).contiguous()
                                                 : at::ones({gv.size(0)}, at::kFloat);
  if (secs.numel() < gv.size(0))
    throw std::invalid_argument("mrope_positions: " + std::to_string(secs.numel()) +
                                " second_per_grid_ts for " + std::to_string(gv.size(0)) + " videos");
  int64_t next_image = 0, next_video = 0,
          video_step = 0;  // video_steps_as_frames: the next temporal step of video next_video
  auto positions = at::zeros({3, B, L}, at::kLong), deltas = at::zeros({B, 1}, at::kLong);
  auto P = positions.accessor<int64_t, 3>();
  const auto I = ids.accessor<int64_t, 2>();
  const auto M = mask.accessor<bool, 2>();
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> cols,
        kind;  // the row's real tokens: their column and type (0 text, 1 image, 2 video)
    for (int64_t j = 0; j < L; ++j)
      if (M[b][j])
        cols.push_back(j), kind.push_back(I[b][j] == c.image_token_id   ? 1
                                          : I[b][j] == c.video_token_id ? 2
                                                                        : 0);
    int64_t cur = 0, top = -1;
    auto put = [&](size_t k, int64_t t, int64_t h, int64_t w) {
      P[0][b][cols[k]] = t, P[1][b][cols[k]] = h, P[2][b][cols[k]] = w;
      top = std::max({top, t, h, w});
    };
    for (size_t k = 0; k < cols.size();) {
      size_t end = k;
      while (end < cols.size() && kind[end] == kind[k]) ++end;
      if (kind[k] == 0) {
        for (size_t q = k; q < end; ++q)
          put(q, cur + int64_t(q - k), cur + int64_t(q - k), cur + int64_t(q - k));
        cur += int64_t(end - k);
        k = end;
        continue;
      }
      const bool video = kind[k] == 2;
      const at::Tensor& g = video ? gv : gi;
      int64_t& next = video ? next_video : next_image;
      const char* what = video ? "video" : "image";
      if (next >= g.size(0))
        throw std::invalid_argument(std::string("mrope_positions: row ") + std::to_string(b) + " has more " +
                                    what + "s than " + what + "_grid_thw rows (" + std::to_string(g.size(0)) +
                                    ")");
      // Qwen3-VL: each run of video tokens is one temporal step of the video, a grid of (1, h, w).
      const bool step_run = video && c.video_steps_as_frames;
      const int64_t t = step_run ? 1 : g[next][0].item<int64_t>(), h = g[next][1].item<int64_t>() / m,
                    w = g[next][2].item<int64_t>() / m;
      if (int64_t(end - k) != t * h * w)
        throw std::invalid_argument(std::string("mrope_positions: row ") + std::to_string(b) + ": " + what +
                                    " " + std::to_string(next) +
                                    (step_run ? " step " + std::to_string(video_step) : std::string()) +
                                    " has " + std::to_string(end - k) + " tokens, its grid " +
                                    grid_text(t, h * m, w * m) + " gives " + std::to_string(t * h * w));
      // Frames step by tokens_per_second * seconds per grid, in fp32 and truncated, as transformers computes
      // them.
      const float step =
          video && !step_run ? static_cast<float>(c.tokens_per_second) * secs[next].item<float>() : 1.0f;
      size_t q = k;
      for (int64_t f = 0; f < t; ++f) {
        const int64_t tid = cur + static_cast<int64_t>(static_cast<float>(f) * step);
        for (int64_t r = 0; r < h; ++r)
          for (int64_t col = 0; col < w; ++col) put(q++, tid, cur + r, cur + col);
      }
      if (!step_run || ++video_step == g[next][0].item<int64_t>()) ++next, video_step = 0;
      cur += std::max(h, w);
      k = end;
    }
    deltas[b][0] = top + 1 - static_cast<int64_t>(cols.size());
  }
  if (next_image != gi.size(0) || next_video != gv.size(0) || video_step != 0)
    throw std::invalid_argument("mrope_positions: the batch has " + std::to_string(next_image) +
                                " images and " + std::to_string(next_video) + " videos but " +
                                std::to_string(gi.size(0)) + " image and " + std::to_string(gv.size(0)) +
                                " video grids");
  return {positions.to(input_ids.device()), deltas.to(input_ids.device())};
}

MRotaryEmbedding::MRotaryEmbedding(int64_t head_dim, double theta, std::vector<int64_t> mrope_section,
                                   bool interleaved)
    : rotary_(head_dim, theta), section_(std::move(mrope_section)), interleaved_(interleaved) {
  const int64_t sum = std::accumulate(section_.begin(), section_.end(), int64_t{0});
  if (section_.size() != 3 || sum * 2 != head_dim)
    throw std::invalid_argument(
        "MRotaryEmbedding: mrope_section must be 3 sections summing to head_dim / 2 = " +
        std::to_string(head_dim / 2) + ", sums to " + std::to_string(sum));
}

std::pair<at::Tensor, at::Tensor> MRotaryEmbedding::cos_sin(const at::Tensor& positions,
                                                            at::ScalarType dtype) const {
  auto pos = positions.dim() == 2 ? positions.unsqueeze(0).expand({3, -1, -1}) : positions;
  if (pos.dim() != 3 || pos.size(0) != 3)
    throw std::invalid_argument("MRotaryEmbedding: positions must be [3, B, L] or [B, L]");
  auto ang = pos.to(at::kFloat).unsqueeze(-1) * rotary_.inv_freq(pos.device());  // [3, B, L, Dh/2] fp32
  if (interleaved_) {
    const int64_t half = ang.size(-1);
    std::vector<int64_t> axis_of(static_cast<size_t>(half), 0);
    for (int64_t i = 0; i < half; ++i)
      if (i % 3 == 1 && i < 3 * section_[1]) axis_of[size_t(i)] = 1;
      else if (i % 3 == 2 && i < 3 * section_[2]) axis_of[size_t(i)] = 2;
    // Frequency i takes its angle from row axis_of[i]: a gather over the axis dimension.
    auto idx = at::tensor(axis_of, at::kLong).to(pos.device()).view({1, 1, 1, half}).expand({1, ang.size(1), ang.size(2), half});
    auto a = ang.gather(0, idx).squeeze(0);  // [B, L, Dh/2]
    auto cos = a.cos(), sin = a.sin();
    return {at::cat({cos, cos}, -1).to(dtype), at::cat({sin, sin}, -1).to(dtype)};
  }
  std::vector<at::Tensor> parts;
  int64_t at_ = 0;
  for (int64_t axis = 0; axis < 3; ++axis) {
    parts.push_back(ang.select(0, axis).narrow(-1, at_, section_[axis]));
    at_ += section_[axis];
  }
  auto a = at::cat(parts, -1);  // [B, L, Dh/2]
  auto cos = a.cos(), sin = a.sin();
  return {at::cat({cos, cos}, -1).to(dtype), at::cat({sin, sin}, -1).to(dtype)};
}

}  // namespace gmod

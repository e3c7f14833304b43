// Collation of prepared samples into padded tensors.
#include "data/batch.h"

#include <algorithm>
#include <cstring>

namespace gmod {
namespace {

// Every sample's videos, in sample order, into b's three video tensors.
void collate_videos(const std::vector<PreparedSample>& samples, Batch& b) {
  int64_t n = 0, rows = 0, values = 0;
  for (const auto& s : samples) {
    if (s.video_grids.size() != s.video_pixels.size() || s.video_seconds.size() != s.video_pixels.size())
      throw std::runtime_error("collate: sample " + s.sample.id + " has " + std::to_string(s.video_pixels.size()) +
                               " videos but " + std::to_string(s.video_grids.size()) + " grids and " +
                               std::to_string(s.video_seconds.size()) + " step lengths");
    for (size_t i = 0; i < s.video_grids.size(); ++i) {
      rows += s.video_grids[i][0] * s.video_grids[i][1] * s.video_grids[i][2];
      values += static_cast<int64_t>(s.video_pixels[i].size());
    }
    n += static_cast<int64_t>(s.video_grids.size());
  }
  if (n == 0) return;
  const int64_t row_size = rows > 0 ? values / rows : 0;
  if (row_size == 0 || row_size * rows != values)
    throw std::runtime_error("collate: " + std::to_string(values) + " video patch values do not make " +
                             std::to_string(rows) + " equal rows");
  b.pixel_values_videos = at::empty({rows, row_size}, at::kFloat);
  b.video_grid_thw = at::empty({n, 3}, at::kLong);
  b.second_per_grid_ts = at::empty({n}, at::kFloat);
  float* px = b.pixel_values_videos.data_ptr<float>();
  int64_t* grid = b.video_grid_thw.data_ptr<int64_t>();
  float* secs = b.second_per_grid_ts.data_ptr<float>();
  for (const auto& s : samples)
    for (size_t i = 0; i < s.video_grids.size(); ++i) {
      const auto& g = s.video_grids[i];
      const auto& p = s.video_pixels[i];
      if (static_cast<int64_t>(p.size()) != g[0] * g[1] * g[2] * row_size)
        throw std::runtime_error("collate: video " + std::to_string(i) + " of sample " + s.sample.id + " has " +
                                 std::to_string(p.size()) + " values for a grid of " +
                                 std::to_string(g[0] * g[1] * g[2]) + " patches of " + std::to_string(row_size));
      std::copy(g.begin(), g.end(), grid);
      grid += 3;
      *secs++ = static_cast<float>(s.video_seconds[i]);
      std::memcpy(px, p.data(), p.size() * sizeof(float));
      px += p.size();
    }
}

}  // namespace

Batch collate(std::vector<PreparedSample>& samples, int32_t pad_id, int image_size) {
  Batch b;
  const int64_t B = static_cast<int64_t>(samples.size());
  int64_t L = 0, n_images = 0, n_grids = 0, patch_rows = 0, patch_values = 0, n_anyres = 0, tiles = 0;
  const int64_t image_numel = 3LL * image_size * image_size;
  for (const auto& s : samples) {
    L = std::max<int64_t>(L, static_cast<int64_t>(s.sample.ids.size()));
    n_images += static_cast<int64_t>(s.pixels.size());
    if (!s.image_sizes.empty()) {
      if (s.image_sizes.size() != s.pixels.size())
        throw std::runtime_error("collate: sample " + s.sample.id + " has " + std::to_string(s.pixels.size()) +
                                 " images but " + std::to_string(s.image_sizes.size()) + " AnyRes image sizes");
      n_anyres += static_cast<int64_t>(s.image_sizes.size());
      for (const auto& p : s.pixels) {
        if (image_numel == 0 || static_cast<int64_t>(p.size()) % image_numel != 0 || p.empty())
          throw std::runtime_error("collate: an AnyRes image of sample " + s.sample.id + " has " +
                                   std::to_string(p.size()) + " values, not a whole number of 3x" +
                                   std::to_string(image_size) + "x" + std::to_string(image_size) + " tiles");
        tiles += static_cast<int64_t>(p.size()) / image_numel;
      }
    }
    if (s.grids.empty()) continue;
    if (s.grids.size() != s.pixels.size())
      throw std::runtime_error("collate: sample " + s.sample.id + " has " + std::to_string(s.pixels.size()) +
                               " images but " + std::to_string(s.grids.size()) + " grids");
    n_grids += static_cast<int64_t>(s.grids.size());
    for (size_t i = 0; i < s.grids.size(); ++i) {
      patch_rows += s.grids[i][0] * s.grids[i][1] * s.grids[i][2];
      patch_values += static_cast<int64_t>(s.pixels[i].size());
    }
  }
  const bool native = n_grids > 0;
  if (native && n_grids != n_images)
    throw std::runtime_error("collate: the batch mixes native-resolution images (" + std::to_string(n_grids) +
                             ") with fixed-size crops (" + std::to_string(n_images - n_grids) + ")");
  if (n_anyres > 0 && (n_anyres != n_images || native))
    throw std::runtime_error("collate: the batch mixes AnyRes images (" + std::to_string(n_anyres) +
                             ") with other kinds (" + std::to_string(n_images - n_anyres) + ")");
  const bool anyres = n_anyres > 0;
  const int64_t row_size = native ? patch_values / patch_rows : 0;
  if (native && row_size * patch_rows != patch_values)
    throw std::runtime_error("collate: " + std::to_string(patch_values) + " patch values do not make " +
                             std::to_string(patch_rows) + " equal rows (images of different patch sizes)");
  b.input_ids = at::full({B, L}, pad_id, at::kLong);
  b.labels = at::full({B, L}, kIgnoreIndex, at::kLong);
  b.attention_mask = at::zeros({B, L}, at::kBool);
  b.token_roles = at::full({B, L}, static_cast<int8_t>(TokenRole::kPad), at::kChar);
  auto ids = b.input_ids.accessor<int64_t, 2>();
  auto labels = b.labels.accessor<int64_t, 2>();
  auto mask = b.attention_mask.accessor<bool, 2>();
  auto roles = b.token_roles.accessor<int8_t, 2>();
  if (native) {
    b.pixel_values = at::empty({patch_rows, row_size}, at::kFloat);
    b.image_grid_thw = at::empty({n_images, 3}, at::kLong);
  } else if (anyres) {
    b.pixel_values = at::empty({tiles, 3, image_size, image_size}, at::kFloat);
    b.image_sizes = at::empty({n_images, 2}, at::kLong);
  } else if (n_images > 0) {
    b.pixel_values = at::empty({n_images, 3, image_size, image_size}, at::kFloat);
  }
  float* px = n_images > 0 ? b.pixel_values.data_ptr<float>() : nullptr;
  int64_t* grid = native ? b.image_grid_thw.data_ptr<int64_t>() : nullptr;
  int64_t* hw = anyres ? b.image_sizes.data_ptr<int64_t>() : nullptr;
  for (int64_t r = 0; r < B; ++r) {
    auto& prepared = samples[static_cast<size_t>(r)];
    auto& s = prepared.sample;
    for (size_t t = 0; t < s.ids.size(); ++t) {
      ids[r][t] = s.ids[t];
      labels[r][t] = s.labels[t];
      mask[r][t] = true;
      roles[r][t] = static_cast<int8_t>(s.roles[t]);
    }
    b.tokens += static_cast<int64_t>(s.ids.size());
    b.truncated += s.truncated ? 1 : 0;
    for (size_t i = 0; i < prepared.pixels.size(); ++i) {
      const auto& p = prepared.pixels[i];
      if (native) {
        const auto& g = prepared.grids[i];
        if (static_cast<int64_t>(p.size()) != g[0] * g[1] * g[2] * row_size)
          throw std::runtime_error("collate: image " + std::to_string(i) + " of sample " + s.id + " has " +
                                   std::to_string(p.size()) + " values for a grid of " +
                                   std::to_string(g[0] * g[1] * g[2]) + " patches of " + std::to_string(row_size));
        std::copy(g.begin(), g.end(), grid);
        grid += 3;
      } else if (anyres) {
        std::copy(prepared.image_sizes[i].begin(), prepared.image_sizes[i].end(), hw);
        hw += 2;
      } else if (static_cast<int64_t>(p.size()) != image_numel) {
        throw std::runtime_error("collate: image of sample " + s.id + " has " + std::to_string(p.size()) +
                                 " values, expected 3*" + std::to_string(image_size) + "^2");
      }
      std::memcpy(px, p.data(), p.size() * sizeof(float));
      px += p.size();
    }
    b.indices.push_back(s.index);
    b.ids.push_back(s.id);
  }
  collate_videos(samples, b);
  return b;
}

ModelInputs to_model_inputs(const Batch& batch, at::Device device) {
  // To an accelerator: pinned host memory (the loader's pin_memory, else pinned here) copied non-blocking, so
  // the host queues the copies and goes on; the caching host allocator keeps each pinned block until its copy
  // is done.
  auto move = [&](const at::Tensor& t) {
    if (!t.defined() || device.is_cpu()) return t.defined() ? t.to(device) : t;
    return (t.is_pinned() ? t : t.pin_memory()).to(device, /*non_blocking=*/true);
  };
  ModelInputs in;
  in.input_ids = move(batch.input_ids);
  in.labels = move(batch.labels);
  in.attention_mask = move(batch.attention_mask);
  in.token_roles = move(batch.token_roles);
  // MoD capacities come from these host-side counts, so no MoD layer waits for the device (model/decoder_layer.h).
  if (batch.input_ids.defined() && batch.segments) {
    in.segments = batch.segments;
    in.positions = move(batch.positions);
    in.host_role_counts = count_segment_roles(batch.token_roles, batch.attention_mask, batch.input_ids.size(0),
                                              batch.input_ids.size(1), *batch.segments);
  } else if (batch.input_ids.defined()) {
    in.host_role_counts = count_routing_roles(batch.token_roles, batch.attention_mask, batch.input_ids.size(0),
                                              batch.input_ids.size(1));
  }
  if (batch.pixel_values.defined()) in.pixel_values = move(batch.pixel_values);
  // The M-RoPE ids and the tower's attention segments are computed from the grids (model/mrope.h).
  if (batch.image_grid_thw.defined()) in.image_grid_thw = move(batch.image_grid_thw);
  if (batch.image_sizes.defined()) in.image_sizes = batch.image_sizes;  // AnyRes: stays on the host, read to pack
  if (batch.pixel_values_videos.defined()) {
    in.pixel_values_videos = move(batch.pixel_values_videos);
    in.video_grid_thw = move(batch.video_grid_thw);
    in.second_per_grid_ts = batch.second_per_grid_ts;  // read on the host by mrope_positions
  }
  return in;
}

}  // namespace gmod

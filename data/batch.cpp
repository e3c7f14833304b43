// Collation of prepared samples into padded tensors.
#include "data/batch.h"

#include <algorithm>
#include <cstring>

namespace gmod {

Batch collate(std::vector<PreparedSample>& samples, int32_t pad_id, int image_size) {
  Batch b;
  const int64_t B = static_cast<int64_t>(samples.size());
  int64_t L = 0, n_images = 0;
  for (const auto& s : samples) {
    L = std::max<int64_t>(L, static_cast<int64_t>(s.sample.ids.size()));
    n_images += static_cast<int64_t>(s.pixels.size());
  }
  b.input_ids = at::full({B, L}, pad_id, at::kLong);
  b.labels = at::full({B, L}, kIgnoreIndex, at::kLong);
  b.attention_mask = at::zeros({B, L}, at::kBool);
  b.token_roles = at::full({B, L}, static_cast<int8_t>(TokenRole::kPad), at::kChar);
  auto ids = b.input_ids.accessor<int64_t, 2>();
  auto labels = b.labels.accessor<int64_t, 2>();
  auto mask = b.attention_mask.accessor<bool, 2>();
  auto roles = b.token_roles.accessor<int8_t, 2>();
  const int64_t image_numel = 3LL * image_size * image_size;
  if (n_images > 0) b.pixel_values = at::empty({n_images, 3, image_size, image_size}, at::kFloat);
  float* px = n_images > 0 ? b.pixel_values.data_ptr<float>() : nullptr;
  for (int64_t r = 0; r < B; ++r) {
    auto& s = samples[static_cast<size_t>(r)].sample;
    for (size_t t = 0; t < s.ids.size(); ++t) {
      ids[r][t] = s.ids[t];
      labels[r][t] = s.labels[t];
      mask[r][t] = true;
      roles[r][t] = static_cast<int8_t>(s.roles[t]);
    }
    b.tokens += static_cast<int64_t>(s.ids.size());
    b.truncated += s.truncated ? 1 : 0;
    for (const auto& p : samples[static_cast<size_t>(r)].pixels) {
      if (static_cast<int64_t>(p.size()) != image_numel)
        throw std::runtime_error("collate: image of sample " + s.id + " has " + std::to_string(p.size()) +
                                 " values, expected 3*" + std::to_string(image_size) + "^2");
      std::memcpy(px, p.data(), p.size() * sizeof(float));
      px += image_numel;
    }
    b.indices.push_back(s.index);
    b.ids.push_back(s.id);
  }
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
  return in;
}

}  // namespace gmod

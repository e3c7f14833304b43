// A collated micro-batch: samples right-padded to the longest one, images stacked in order of occurrence.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "data/dataset.h"
#include "model/llava.h"

namespace gmod {

struct Batch {
  at::Tensor input_ids;         // [B, L] int64, pad id after each sample's end
  at::Tensor labels;            // [B, L] int64, -100 = not supervised (and padding)
  at::Tensor attention_mask;    // [B, L] bool, true = real token
  at::Tensor token_roles;       // [B, L] int8 TokenRole, kPad on padding
  at::Tensor pixel_values;      // [N_images, 3, S, S] float32; undefined when the batch has no image
                                // (native-resolution images: their patches concatenated, [sum of rows, C*T*P*P])
  at::Tensor image_grid_thw;    // [N_images, 3] int64 grid of each native-resolution image; else undefined
  // [N_images, 2] int64 (height, width) of each AnyRes image; pixel_values then holds every image's tiles
  // [sum of tiles, 3, S, S], image by image (data/anyres.h); else undefined
  at::Tensor image_sizes;
  // Videos (data/video_prep.h), in sample order: their patches [sum of rows, C*T*P*P] float32, grids [N_videos, 3]
  // int64 and seconds per temporal grid step [N_videos] float32; undefined when the batch has no video.
  at::Tensor pixel_values_videos;
  at::Tensor video_grid_thw;
  at::Tensor second_per_grid_ts;
  // Packed batches (data/pack.h) only: the samples each row holds, and positions [B, L] restarting per sample.
  std::shared_ptr<const SegmentLayout> segments;
  at::Tensor positions;
  std::vector<size_t> indices;  // global record index of each sample (packed: in row-major segment order)
  std::vector<std::string> ids;
  std::vector<BadRecord> skipped;  // records of this micro-batch's slice that were skipped
  int64_t sequence = 0;            // micro-batch number since the loader started
  int64_t tokens = 0;              // real (non-pad) tokens
  int64_t truncated = 0;           // rows whose sample was cut to max_len

  // Samples (= rows unless packed). Can be 0 when every record of the slice was bad: the trainer must still take
  // part in the step.
  int64_t size() const { return static_cast<int64_t>(indices.size()); }
  bool empty() const { return indices.empty(); }
};

// Pads to the batch maximum with pad_id / -100 / false / kPad. `image_size` is the crop size (for the
// pixel_values shape); images are copied in sample order. Samples with grids (native-resolution patches) have their
// patches concatenated and image_grid_thw filled instead; samples with image_sizes (AnyRes) have their tiles
// stacked, however many each image has, and image_sizes filled. A batch mixing kinds is refused. Videos are
// concatenated the same way into pixel_values_videos / video_grid_thw / second_per_grid_ts.
Batch collate(std::vector<PreparedSample>& samples, int32_t pad_id, int image_size);

// Moves the tensors to `device` (non-blocking from pinned memory is not attempted; CPU tensors are returned
// as is).
ModelInputs to_model_inputs(const Batch& batch, at::Device device);

}  // namespace gmod

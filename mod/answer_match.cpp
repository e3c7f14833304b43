// See answer_match.h.
#include "mod/answer_match.h"

#include <torch/torch.h>

#include "mod/generate.h"
#include "model/anyres_grid.h"

namespace gmod {

namespace {
// Native-resolution images or videos (image_grid_thw / video_grid_thw, Qwen2.5-VL, Qwen3-VL): `count` of them
// from grid `first` on, as the rows of the concatenated patches they occupy (offset, rows) and their grids.
struct NativeImages {
  int64_t patch_offset = 0, patch_rows = 0;
  at::Tensor grids;
};
NativeImages native_images(const at::Tensor& grid_thw, int64_t first, int64_t count) {
  const at::Tensor rows = grid_thw.prod(1);
  NativeImages out;
  out.patch_offset = first > 0 ? rows.narrow(0, 0, first).sum().item<int64_t>() : 0;
  out.patch_rows = count > 0 ? rows.narrow(0, first, count).sum().item<int64_t>() : 0;
  out.grids = grid_thw.narrow(0, first, count);
  return out;
}
// How many images of the grids from `first` on fill `tokens` image tokens (each t*h*w / merge_unit tokens).
int64_t images_in_tokens(const at::Tensor& grid_thw, int64_t first, int64_t tokens, int64_t merge_unit) {
  int64_t n = 0;
  const at::Tensor rows = grid_thw.prod(1);
  while (tokens > 0 && first + n < rows.size(0)) tokens -= rows[first + n++].item<int64_t>() / merge_unit;
  return n;
}
// AnyRes images (image_sizes, LLaVA-NeXT): how many from image `first` on fill `tokens` image tokens, and the tiles
// before image `first` / of `count` images from it (each image's own count, model/anyres_grid.h).
struct AnyresImages {
  const AnyresConfig* c = nullptr;
  at::Tensor sizes;  // [N, 2] on the host
  int tile = 0, side = 0;
  int h(int64_t i) const { return static_cast<int>(sizes[i][0].item<int64_t>()); }
  int w(int64_t i) const { return static_cast<int>(sizes[i][1].item<int64_t>()); }
  int64_t in_tokens(int64_t first, int64_t tokens) const {
    int64_t n = 0;
    for (; tokens > 0 && first + n < sizes.size(0); ++n)
      tokens -= anyres_image_tokens(h(first + n), w(first + n), *c, tile, side);
    return n;
  }
  int64_t tiles(int64_t first, int64_t count) const {
    int64_t t = 0;
    for (int64_t i = first; i < first + count; ++i) t += anyres_num_tiles(h(i), w(i), *c, tile);
    return t;
  }
};
}  // namespace

std::pair<int64_t, int64_t> first_answer_exact_match(MultimodalLM& model, const ModelInputs& in) {
  int64_t hits = 0, counted = 0, image_offset = 0;
  const at::Tensor ids = in.input_ids.cpu(), labels = in.labels.cpu();
  const bool native = in.image_grid_thw.defined();
  const at::Tensor grids = native ? in.image_grid_thw.cpu() : at::Tensor();
  // Tokens per grid cell of native-resolution images and videos (Qwen2.5-VL, Qwen3-VL): spatial_merge_size^2.
  const int64_t merge_unit =
      model.config.mrope ? model.config.mrope->spatial_merge_size * model.config.mrope->spatial_merge_size
                         : 1;
  const bool videos = in.video_grid_thw.defined() && model.config.mrope;
  const at::Tensor video_grids = videos ? in.video_grid_thw.cpu() : at::Tensor();
  const int64_t video_id = videos ? model.config.mrope->video_token_id : -1;
  int64_t video_offset = 0;
  const int64_t per_image = model.config.vision ? model.config.image_seq_length() : 0;
  const bool anyres = in.image_sizes.defined() && model.config.anyres && model.config.vision;
  AnyresImages ar;
  if (anyres) {
    ar.c = &*model.config.anyres;
    ar.sizes = in.image_sizes.cpu().to(at::kLong);
    ar.tile = model.config.vision->image_size;
    ar.side = ar.tile / model.config.vision->patch_size;
  }
  for (int64_t b = 0; b < ids.size(0); ++b) {
    const at::Tensor row_ids = ids[b], row_labels = labels[b];
    const int64_t image_tokens = row_ids.eq(model.config.image_token_id).sum().item<int64_t>();
    const int64_t n_images = native   ? images_in_tokens(grids, image_offset, image_tokens, merge_unit)
                             : anyres ? ar.in_tokens(image_offset, image_tokens)
                             : per_image > 0 ? image_tokens / per_image : 0;
    const int64_t n_videos = videos ? images_in_tokens(video_grids, video_offset,
                                                       row_ids.eq(video_id).sum().item<int64_t>(), merge_unit)
                                    : 0;
    const at::Tensor sup = row_labels.ne(-100).nonzero().reshape({-1});
    if (sup.numel() == 0) {
      image_offset += n_images;
      video_offset += n_videos;
      continue;
    }
    const int64_t start = sup[0].item<int64_t>();
    int64_t end = start;
    while (end < row_labels.size(0) && row_labels[end].item<int64_t>() != -100) ++end;
    ModelInputs prompt;
    prompt.input_ids = in.input_ids.narrow(0, b, 1).narrow(1, 0, start);
    if (in.token_roles.defined()) prompt.token_roles = in.token_roles.narrow(0, b, 1).narrow(1, 0, start);
    if (n_images > 0 && native) {  // the prompt's own images only: those whose tokens lie before the answer
      const int64_t in_prompt = images_in_tokens(
          grids, image_offset, prompt.input_ids.eq(model.config.image_token_id).sum().item<int64_t>(), merge_unit);
      if (in_prompt > 0) {
        const NativeImages im = native_images(grids, image_offset, in_prompt);
        prompt.pixel_values = in.pixel_values.narrow(0, im.patch_offset, im.patch_rows);
        prompt.image_grid_thw = im.grids.to(in.image_grid_thw.device());
      }
    } else if (n_images > 0 && anyres) {  // the prompt's own images, as for native ones, and their tiles
      const int64_t in_prompt =
          ar.in_tokens(image_offset, prompt.input_ids.eq(model.config.image_token_id).sum().item<int64_t>());
      if (in_prompt > 0) {
        prompt.pixel_values =
            in.pixel_values.narrow(0, ar.tiles(0, image_offset), ar.tiles(image_offset, in_prompt));
        prompt.image_sizes = in.image_sizes.narrow(0, image_offset, in_prompt);
      }
    } else if (n_images > 0) {
      prompt.pixel_values = in.pixel_values.narrow(0, image_offset, n_images);
    }
    image_offset += n_images;
    if (n_videos > 0) {  // the prompt's own videos, as for native images
      const int64_t in_prompt = images_in_tokens(
          video_grids, video_offset, prompt.input_ids.eq(video_id).sum().item<int64_t>(), merge_unit);
      if (in_prompt > 0) {
        const NativeImages v = native_images(video_grids, video_offset, in_prompt);
        prompt.pixel_values_videos = in.pixel_values_videos.narrow(0, v.patch_offset, v.patch_rows);
        prompt.video_grid_thw = v.grids.to(in.video_grid_thw.device());
        if (in.second_per_grid_ts.defined())
          prompt.second_per_grid_ts = in.second_per_grid_ts.narrow(0, video_offset, in_prompt);
      }
    }
    video_offset += n_videos;
    GenerateOptions g;
    g.max_new_tokens = end - start;
    g.eos_token_id = -1;  // generate exactly the answer's length
    const GenerateResult r = generate(model, prompt, g);
    hits += r.tokens.cpu()[0].narrow(0, 0, end - start).equal(row_ids.narrow(0, start, end - start)) ? 1 : 0;
    ++counted;
  }
  return {hits, counted};
}

}  // namespace gmod

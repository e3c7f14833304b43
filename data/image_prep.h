// How the images of a record become model input, chosen once from the model / processor config: the tokens each
// image occupies in the sequence and its pixel values. Two kinds:
//   fixed-size (LLaVA, CLIP towers): every image is image_seq_length tokens of image_token_id and one CHW crop
//     [3, S, S] (data/clip_preprocess.h); `<image>` moves to the front of its turn (ConversationConfig::image_first);
//   native-resolution (Qwen2-VL / Qwen2.5-VL): an image keeps its aspect ratio (data/native_resolution.h), becomes
//     <|vision_start|>, grid_t * grid_h * grid_w / merge_size^2 tokens <|image_pad|>, <|vision_end|>, and its
//     patches [grid_t * grid_h * grid_w, C * T * P * P] with its grid; an image stays where the record writes it,
//     as Qwen's chat template renders a message's items in order;
//   AnyRes (LLaVA-NeXT): an image becomes its base tile and the tiles of its best pinpoint ([1 + tiles, 3, S, S],
//     data/anyres.h) with its (height, width) for the model's image_sizes, and takes anyres_image_tokens positions
//     of image_token_id (base patches + unpadded grid + one newline a row, as model/llava_next.h packs them);
//     `<image>` moves to the front of its turn as for LLaVA-1.5. LLaVA-OneVision (anyres_max_N) is AnyRes with its
//     downscale of large grids in the token count, and an image of a record with several images is its base image
//     only (padded to a square with the mean colour, as LlavaOnevisionImageProcessor does), side^2 + 1 tokens, its
//     image_size negated (model/anyres_grid.h, anyres_base_only).
// The dataset, the collator and the trainer ask the preparer; none of them tests which model it is.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/clip_preprocess.h"
#include "data/native_resolution.h"
#include "model/anyres_grid.h"

namespace gmod {

struct LlavaConfig;
class Tokenizer;

// The tokens of one image in the sequence: [start] `count` x `id` [end]. Only the `count` ids are image positions
// (TokenRole::kImage); start and end are text the model sees (role of the surrounding turn, never supervised).
struct ImageTokens {
  std::optional<int32_t> start;
  int32_t id = 0;
  int64_t count = 0;
  std::optional<int32_t> end;
  int64_t total() const { return count + (start ? 1 : 0) + (end ? 1 : 0); }
};

// The tokens of one video in the sequence, in order. The positions holding `id` (the video token) carry the
// video's features (TokenRole::kImage); the others (vision start / end, Qwen3-VL's "<t seconds>" text) are
// text the model sees, of the surrounding turn's role and never supervised. Each model family's layout writes
// them (data/video_layout.h).
struct VideoTokens {
  std::vector<int32_t> ids;
  int32_t id = 0;
  int64_t count() const {
    int64_t n = 0;
    for (int32_t v : ids) n += v == id;
    return n;
  }
};

// One image's pixel values: a CHW crop [3, S, S] (grid_thw all 0), patches [rows, row_size] with their grid, or
// AnyRes tiles [tiles, 3, S, S] with the image's (height, width).
struct PreparedImage {
  std::vector<float> pixels;
  std::array<int64_t, 3> grid_thw{};  // {0, 0, 0}: a fixed-size crop
  std::array<int64_t, 2> image_size{};  // AnyRes: the original (height, width); {0, 0} otherwise
  bool native() const { return grid_thw[0] > 0; }
  bool anyres() const { return image_size[0] != 0; }  // negative: a base-only OneVision image
};

class ImagePreparer {
 public:
  virtual ~ImagePreparer() = default;
  // Whether tokens() depends on the image's size: then the dataset reads every image's header before templating.
  virtual bool size_dependent() const = 0;
  // The tokens of an image of `width` x `height` pixels (ignored when !size_dependent()).
  virtual ImageTokens tokens(int width, int height) const = 0;
  // Pixel values of a decoded image.
  virtual PreparedImage prepare(const Image& img) const = 0;
  // tokens() and prepare() for an image of a record with `images` images in all: LLaVA-OneVision treats an image of
  // a record with several differently (its base image only); every other preparer ignores the count.
  virtual ImageTokens tokens_among(int width, int height, size_t /*images*/) const { return tokens(width, height); }
  virtual PreparedImage prepare_among(const Image& img, size_t /*images*/) const { return prepare(img); }
  // Whether `<image>` placeholders move to the front of their turn (LLaVA's preprocess_multimodal) or stay put.
  virtual bool image_first() const = 0;
  // One line for logs: "CLIP crops 336x336, 576 tokens each" / "native resolution, patch 14, merge 2, ...".
  virtual std::string describe() const = 0;
};

// Fixed-size crops: clip_preprocess with `cfg`, `seq_length` tokens of `image_token_id` per image.
std::shared_ptr<const ImagePreparer> make_clip_image_preparer(const ClipPreprocessConfig& cfg, int32_t image_token_id,
                                                              int seq_length);

// Native resolution with `cfg`; each image is `vision_start` pad*N `vision_end`, pad = `image_token_id`.
std::shared_ptr<const ImagePreparer> make_native_image_preparer(const NativeResolutionConfig& cfg,
                                                                int32_t image_token_id, int32_t vision_start,
                                                                int32_t vision_end);

// AnyRes tiles with `cfg` (tile side cfg.crop, base image cfg.size) and `anyres`; an image of h x w takes
// anyres_image_tokens(h, w, anyres, cfg.crop, cfg.crop / patch_size) tokens of `image_token_id`. Throws
// std::invalid_argument when the crop is not a multiple of patch_size or the pinpoints are empty.
std::shared_ptr<const ImagePreparer> make_anyres_image_preparer(const ClipPreprocessConfig& cfg,
                                                                const AnyresConfig& anyres, int patch_size,
                                                                int32_t image_token_id);

// The preparer `model` takes, the one place that decides: AnyRes tiles for a LLaVA-NeXT config (`anyres`; the
// processor's crop must be the tower's image size); native resolution for a Qwen2.5-VL vision encoder (its
// preprocessor_config.json in `preprocessor_dir` when that holds one, else the defaults of data/native_resolution.h
// with the encoder's patch, temporal patch and merge sizes; <|vision_start|> / <|vision_end|> from `tokenizer`,
// which must give <|image_pad|> the model's image_token_id), CLIP crops from `clip` otherwise (image_seq_length
// tokens of image_token_id). Throws std::invalid_argument naming what disagrees.
std::shared_ptr<const ImagePreparer> make_image_preparer(const LlavaConfig& model, const ClipPreprocessConfig& clip,
                                                         const std::string& preprocessor_dir,
                                                         const Tokenizer& tokenizer);

}  // namespace gmod

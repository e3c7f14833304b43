// The three image preparers: fixed-size CLIP crops, native-resolution patches and AnyRes tiles.
#include "data/image_prep.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>

#include "data/anyres.h"
#include "data/tokenizer.h"
#include "model/config.h"

namespace gmod {
namespace {

class ClipImagePreparer final : public ImagePreparer {
 public:
  ClipImagePreparer(const ClipPreprocessConfig& cfg, int32_t id, int seq) : cfg_(cfg), id_(id), seq_(seq) {}
  bool size_dependent() const override { return false; }
  ImageTokens tokens(int, int) const override { return {std::nullopt, id_, seq_, std::nullopt}; }
  PreparedImage prepare(const Image& img) const override { return {clip_preprocess(img, cfg_), {}}; }
  bool image_first() const override { return true; }
  std::string describe() const override {
    return "CLIP crops " + std::to_string(cfg_.crop) + "x" + std::to_string(cfg_.crop) + ", " + std::to_string(seq_) +
           " tokens each";
  }

 private:
  ClipPreprocessConfig cfg_;
  int32_t id_;
  int seq_;
};

class NativeImagePreparer final : public ImagePreparer {
 public:
  NativeImagePreparer(const NativeResolutionConfig& cfg, int32_t id, int32_t start, int32_t end)
      : cfg_(cfg), id_(id), start_(start), end_(end) {}
  bool size_dependent() const override { return true; }
  ImageTokens tokens(int width, int height) const override {
    const auto hw = smart_resize(height, width, cfg_.factor(), cfg_.min_pixels, cfg_.max_pixels);
    const int64_t patches = int64_t(hw[0] / cfg_.patch_size) * (hw[1] / cfg_.patch_size);
    return {start_, id_, patches / (int64_t(cfg_.merge_size) * cfg_.merge_size), end_};
  }
  PreparedImage prepare(const Image& img) const override {
    NativePatches p = preprocess_native_image(img, cfg_);
    return {std::move(p.pixel_values), p.grid_thw};
  }
  bool image_first() const override { return false; }
  std::string describe() const override {
    return "native resolution, patch " + std::to_string(cfg_.patch_size) + ", merge " +
           std::to_string(cfg_.merge_size) + ", " + std::to_string(cfg_.min_pixels) + " to " +
           std::to_string(cfg_.max_pixels) + " pixels";
  }

 private:
  NativeResolutionConfig cfg_;
  int32_t id_, start_, end_;
};

class AnyresImagePreparer final : public ImagePreparer {
 public:
  AnyresImagePreparer(const ClipPreprocessConfig& cfg, const AnyresConfig& anyres, int patch, int32_t id)
      : cfg_(cfg), anyres_(anyres), patch_(patch), id_(id) {}
  bool size_dependent() const override { return true; }
  ImageTokens tokens(int width, int height) const override {
    return {std::nullopt, id_, anyres_image_tokens(height, width, anyres_, cfg_.crop, cfg_.crop / patch_),
            std::nullopt};
  }
  ImageTokens tokens_among(int width, int height, size_t images) const override {
    if (!base_only(images)) return tokens(width, height);
    const int side = cfg_.crop / patch_;
    return {std::nullopt, id_, int64_t(side) * side + 1, std::nullopt};
  }
  PreparedImage prepare_among(const Image& img, size_t images) const override {
    if (!base_only(images)) return prepare(img);
    ClipPreprocessConfig square = cfg_;  // LlavaOnevisionImageProcessor: pad to a square with the mean colour
    square.pad_to_square = true;
    PreparedImage out;
    out.pixels = clip_preprocess(img, square);
    out.image_size = {-int64_t(img.height), -int64_t(img.width)};  // anyres_base_only
    return out;
  }
  PreparedImage prepare(const Image& img) const override {
    AnyresImage a = anyres_preprocess(img, cfg_, anyres_);
    PreparedImage out;
    out.pixels = std::move(a.pixels);
    out.image_size = {a.image_size[0], a.image_size[1]};
    return out;
  }
  bool image_first() const override { return true; }
  std::string describe() const override {
    std::string pins;
    for (const auto& p : anyres_.pinpoints)
      pins += (pins.empty() ? "" : ", ") + std::to_string(p[0]) + "x" + std::to_string(p[1]);
    return "AnyRes tiles " + std::to_string(cfg_.crop) + "x" + std::to_string(cfg_.crop) + ", pinpoints (h x w) " +
           pins + (anyres_.max_patches > 0 ? ", anyres_max_" + std::to_string(anyres_.max_patches) : "");
  }

 private:
  bool base_only(size_t images) const { return anyres_.max_patches > 0 && images > 1; }

  ClipPreprocessConfig cfg_;
  AnyresConfig anyres_;
  int patch_;
  int32_t id_;
};

}  // namespace

std::shared_ptr<const ImagePreparer> make_anyres_image_preparer(const ClipPreprocessConfig& cfg,
                                                                const AnyresConfig& anyres, int patch_size,
                                                                int32_t image_token_id) {
  // SigLIP's patch conv drops the pixels past the last whole patch (384 px at patch 14: 27^2 patches).
  if (patch_size < 1 || cfg.crop < patch_size)
    throw std::invalid_argument("AnyRes image preparer: the crop size " + std::to_string(cfg.crop) +
                                " is smaller than the tower's patch size " + std::to_string(patch_size));
  if (anyres.pinpoints.empty()) throw std::invalid_argument("AnyRes image preparer: no image_grid_pinpoints");
  return std::make_shared<AnyresImagePreparer>(cfg, anyres, patch_size, image_token_id);
}

std::shared_ptr<const ImagePreparer> make_clip_image_preparer(const ClipPreprocessConfig& cfg, int32_t image_token_id,
                                                              int seq_length) {
  return std::make_shared<ClipImagePreparer>(cfg, image_token_id, seq_length);
}

std::shared_ptr<const ImagePreparer> make_native_image_preparer(const NativeResolutionConfig& cfg,
                                                                int32_t image_token_id, int32_t vision_start,
                                                                int32_t vision_end) {
  if (cfg.patch_size < 1 || cfg.merge_size < 1 || cfg.temporal_patch_size < 1)
    throw std::invalid_argument("native-resolution image preparer: patch_size, merge_size and temporal_patch_size "
                                "must be >= 1");
  return std::make_shared<NativeImagePreparer>(cfg, image_token_id, vision_start, vision_end);
}

std::shared_ptr<const ImagePreparer> make_image_preparer(const LlavaConfig& model, const ClipPreprocessConfig& clip,
                                                         const std::string& preprocessor_dir,
                                                         const Tokenizer& tokenizer) {
  if (model.anyres && model.vision) {
    if (clip.crop != model.vision->image_size)
      throw std::invalid_argument("AnyRes (LLaVA-NeXT): the image processor's crop size " + std::to_string(clip.crop) +
                                  " is not the vision tower's image_size " + std::to_string(model.vision->image_size) +
                                  " (the tiles are the tower's input)");
    return make_anyres_image_preparer(clip, *model.anyres, model.vision->patch_size, model.image_token_id);
  }
  if (!model.qwen_vision && !model.qwen3_vision)
    return make_clip_image_preparer(clip, model.image_token_id, std::max(model.image_seq_length(), 1));
  // Qwen2.5-VL and Qwen3-VL share the image processor (transformers maps both to Qwen2VLImageProcessor); only the
  // encoder's patch geometry differs (Qwen3-VL: patch 16), and it comes from whichever encoder the model has.
  struct Geometry {
    int64_t patch_size, temporal_patch_size, spatial_merge_size;
  };
  const Geometry v = model.qwen_vision ? Geometry{model.qwen_vision->patch_size, model.qwen_vision->temporal_patch_size,
                                                  model.qwen_vision->spatial_merge_size}
                                       : Geometry{model.qwen3_vision->patch_size,
                                                  model.qwen3_vision->temporal_patch_size,
                                                  model.qwen3_vision->spatial_merge_size};
  const std::filesystem::path pre = std::filesystem::path(preprocessor_dir) / "preprocessor_config.json";
  NativeResolutionConfig cfg;
  std::string source = "the defaults";
  if (!preprocessor_dir.empty() && std::filesystem::exists(pre)) {
    cfg = load_native_resolution_config(pre.string());
    source = pre.string();
  } else {
    cfg.patch_size = static_cast<int>(v.patch_size);
    cfg.temporal_patch_size = static_cast<int>(v.temporal_patch_size);
    cfg.merge_size = static_cast<int>(v.spatial_merge_size);
  }
  if (cfg.patch_size != v.patch_size || cfg.temporal_patch_size != v.temporal_patch_size ||
      cfg.merge_size != v.spatial_merge_size)
    throw std::invalid_argument(source + ": patch_size " + std::to_string(cfg.patch_size) + ", temporal_patch_size " +
                                std::to_string(cfg.temporal_patch_size) + ", merge_size " +
                                std::to_string(cfg.merge_size) + " differ from the vision encoder's (" +
                                std::to_string(v.patch_size) + ", " + std::to_string(v.temporal_patch_size) + ", " +
                                std::to_string(v.spatial_merge_size) + ")");
  auto need = [&](const char* name) {
    const auto id = tokenizer.token_to_id(name);
    if (!id) throw std::invalid_argument(std::string("native-resolution images need the token ") + name +
                                         " in the tokenizer");
    return *id;
  };
  const int32_t start = need("<|vision_start|>"), end = need("<|vision_end|>"), pad = need("<|image_pad|>");
  if (pad != model.image_token_id)
    throw std::invalid_argument("the tokenizer's <|image_pad|> is id " + std::to_string(pad) +
                                ", the model's image_token_id " + std::to_string(model.image_token_id));
  return make_native_image_preparer(cfg, model.image_token_id, start, end);
}

}  // namespace gmod

// A LLaVA instruction dataset on disk: record file + image folder + template + truncation + CLIP
// preprocessing. prepare(i) turns record i into a ready sample (tokens and preprocessed pixels) or throws
// SampleError saying why the record cannot be used. Shared by the loader (training) and `gmod data check`.
// Thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "data/clip_preprocess.h"
#include "data/image.h"
#include "data/image_prep.h"
#include "data/records.h"
#include "data/sample.h"
#include "data/video_prep.h"

namespace gmod {

struct DatasetConfig {
  std::string data_path;     // train.json (list) or train.jsonl
  // Image paths in records are relative to it ("" = the working directory) and must stay inside it: an absolute
  // path, a NUL byte, or a path whose `..` components climb above the folder (checked on the text, after removing
  // `.` and `x/..` pairs) is refused as reason "image_path". Symbolic links inside the folder are followed wherever
  // they point: the folder's layout is the operator's (LLaVA setups link coco/, gqa/, ... into it), the records
  // may come from anywhere.
  std::string image_folder;
  int64_t max_image_pixels = kDefaultMaxImagePixels;  // decoded width x height per image, checked from the header
  ConversationConfig conversation;
  SampleConfig sample;
  ClipPreprocessConfig image;
  // How images become tokens and pixels (data/image_prep.h), chosen once from the model's config (the trainer's
  // make_image_preparer); null = fixed-size CLIP crops from `image` with conversation.image_seq_length tokens each.
  std::shared_ptr<const ImagePreparer> image_preparer;
  // How videos become tokens and pixels (data/video_prep.h, the trainer's make_video_preparer); null = the model takes
  // no video and a record with one is a bad record (reason "video"). Video paths resolve as image paths do.
  std::shared_ptr<const VideoPreparer> video_preparer;
  bool use_index_cache = true;  // <data_path>.gmodidx
};

struct PreparedSample {
  TokenizedSample sample;
  std::vector<std::vector<float>> pixels;  // per image: CHW [3, crop, crop], native-resolution patches or AnyRes tiles
  std::vector<std::array<int64_t, 3>> grids;  // per image with native-resolution patches: its grid_thw; else empty
  std::vector<std::array<int64_t, 2>> image_sizes;  // per AnyRes image (pixels: its tiles): (height, width); else empty
  // Per video (data/video_prep.h): its patches, grid_thw and seconds per temporal grid step.
  std::vector<std::vector<float>> video_pixels;
  std::vector<std::array<int64_t, 3>> video_grids;
  std::vector<double> video_seconds;
};

// A record that was skipped, for statistics and logs.
struct BadRecord {
  size_t index = 0;
  std::string id;
  std::string reason;   // SampleError::reason()
  std::string message;  // names file, record index and id
};

// Every SampleError reason Dataset::prepare gives, in a fixed order (for counting over ranks).
const std::vector<std::string>& sample_error_reasons();

class Dataset {
 public:
  Dataset(DatasetConfig config, std::shared_ptr<const Tokenizer> tokenizer);

  size_t size() const { return records_->size(); }
  // Record -> template -> truncation -> decoded, preprocessed images and videos (a video's header is read before
  // templating, its frames decoded for the rounds kept; `decode_images` false reads headers only). Throws SampleError
  // (reason "video" for a missing, unreadable, corrupt, truncated or unsupported video, or any video when the model
  // takes none; other reasons:
  // "malformed", "roles", "no_answer", "placeholder", "too_long", "image", "image_path", "video"; see
  // sample_error_reasons()).
  PreparedSample prepare(size_t index, bool decode_images = true) const;
  // Same, reporting a bad record instead of throwing; returns false when bad.
  bool try_prepare(size_t index, PreparedSample& out, BadRecord& bad, bool decode_images = true) const;
  // LLaVA's modality lengths for group_by_modality_length: word count (+128 with an image), negative for
  // text-only; malformed records get -1. Read from the index's side cache (`<file>.gmodidx.modality_lengths.v1`)
  // when it matches the file, else every record is parsed once on all cores and the cache written; kept after that.
  // (Several ranks share the work with trainer/shared_lengths.h instead, through the three calls below.)
  const std::vector<int64_t>& modality_lengths() const;
  // True when the lengths are held, read from the side cache now if they were not.
  bool load_cached_modality_lengths() const;
  // The lengths of records [begin, end), parsed on `threads` threads (none held or cached by this call).
  std::vector<int64_t> compute_modality_lengths(size_t begin, size_t end, unsigned threads) const;
  // Holds `lengths` (one per record, else std::invalid_argument) as modality_lengths(), writing the side cache when
  // `write_cache` (returns whether it was written); lengths held already are kept (they come from the same file).
  bool adopt_modality_lengths(std::vector<int64_t> lengths, bool write_cache) const;
  // Records parsed for their modality length by this Dataset so far (0 when they came from the cache).
  size_t modality_lengths_parsed() const { return lengths_parsed_.load(); }

  const RecordFile& records() const { return *records_; }
  const ConversationEncoder& encoder() const { return *encoder_; }
  const ImagePreparer& image_preparer() const { return *preparer_; }
  const DatasetConfig& config() const { return config_; }
  // The file an image path of a record names; throws std::invalid_argument saying why when it is absolute,
  // contains a NUL byte or leaves the image folder (see DatasetConfig::image_folder).
  std::string image_path(const std::string& rel) const;
  std::string where(size_t index, const std::string& id) const;

 private:
  DatasetConfig config_;
  std::unique_ptr<RecordFile> records_;
  std::unique_ptr<ConversationEncoder> encoder_;
  std::shared_ptr<const ImagePreparer> preparer_;
  mutable std::mutex lengths_mutex_;
  mutable bool lengths_held_ = false;
  mutable std::vector<int64_t> lengths_;
  mutable std::atomic<size_t> lengths_parsed_{0};
};

}  // namespace gmod

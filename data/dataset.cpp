// Record -> PreparedSample, with every failure mapped to a SampleError reason.
#include "data/dataset.h"

#include "data/record_lengths.h"

#include <algorithm>
#include <filesystem>
#include <thread>


namespace gmod {

Dataset::Dataset(DatasetConfig config, std::shared_ptr<const Tokenizer> tokenizer)
    : config_(std::move(config)) {
  records_ = std::make_unique<RecordFile>(config_.data_path, config_.use_index_cache);
  encoder_ = std::make_unique<ConversationEncoder>(std::move(tokenizer), config_.conversation);
  preparer_ = config_.image_preparer ? config_.image_preparer
                                     : make_clip_image_preparer(config_.image, config_.conversation.image_token_id,
                                                                std::max(config_.conversation.image_seq_length, 1));
  if (config_.sample.max_len < 1)
    throw std::invalid_argument("max_len must be >= 1, got " + std::to_string(config_.sample.max_len));
}

const std::vector<std::string>& sample_error_reasons() {
  static const std::vector<std::string> r = {"malformed", "roles",  "no_answer", "placeholder",
                                             "too_long",  "image", "image_path", "video"};
  return r;
}

std::string Dataset::image_path(const std::string& rel) const {
  if (rel.find('\0') != std::string::npos)
    throw std::invalid_argument("image path '" + rel.substr(0, rel.find('\0')) + "\\0...' contains a NUL byte");
  if (!rel.empty() && rel[0] == '/')
    throw std::invalid_argument("image path '" + rel +
                                "' is absolute; image paths must be relative to the image folder");
  // Depth below the folder after each component, on the text: "a/../b" stays inside, "a/../../b" does not.
  int64_t depth = 0;
  size_t i = 0;
  while (i <= rel.size()) {
    const size_t j = std::min(rel.find('/', i), rel.size());
    const std::string part = rel.substr(i, j - i);
    if (part == "..") {
      if (--depth < 0)
        throw std::invalid_argument("image path '" + rel + "' leaves the image folder" +
                                    (config_.image_folder.empty() ? std::string() : " " + config_.image_folder) +
                                    " ('..' above it is refused)");
    } else if (!part.empty() && part != ".") {
      ++depth;
    }
    i = j + 1;
  }
  if (config_.image_folder.empty()) return rel;
  return (std::filesystem::path(config_.image_folder) / rel).string();
}

std::string Dataset::where(size_t index, const std::string& id) const {
  return config_.data_path + ": record " + std::to_string(index) + (id.empty() ? "" : " (id '" + id + "')");
}

PreparedSample Dataset::prepare(size_t index, bool decode_images) const {
  Record rec;
  try {
    rec = records_->get(index);
  } catch (const RecordError& e) {
    throw SampleError("malformed", e.what());
  }
  if (!rec.videos.empty() && !config_.video_preparer)
    throw SampleError("video", where(index, rec.id) + ": has " + std::to_string(rec.videos.size()) +
                                   " video(s) ('" + rec.videos[0] + "'); this model takes no video input");
  PreparedSample out;
  auto resolve = [&](const std::string& rel) {
    try {
      return image_path(rel);
    } catch (const std::invalid_argument& e) {
      throw SampleError("image_path", where(index, rec.id) + ": " + e.what());
    }
  };
  auto image_error = [&](const std::string& rel, const std::exception& e) {
    return SampleError("image", where(index, rec.id) + ": image '" + rel + "': " + e.what());
  };
  // Images whose token count depends on their size (native resolution, AnyRes): every header is read first, so that the
  // template can give each image its span. Fixed-size images are only looked at for the rounds truncation keeps.
  std::vector<ImageTokens> spans;
  if (preparer_->size_dependent() && !rec.images.empty()) {
    for (const auto& rel : rec.images) {
      const std::string path = resolve(rel);
      try {
        const ImageInfo info = probe_image_file(path, config_.max_image_pixels);
        spans.push_back(preparer_->tokens_among(info.width, info.height, rec.images.size()));
      } catch (const std::exception& e) {
        throw image_error(rel, e);
      }
    }
  }
  // Videos: every header is read and its frames sampled first (the span depends on both); decoded after truncation.
  std::vector<VideoTokens> video_spans;
  auto video_error = [&](const std::string& rel, const std::exception& e) {
    return SampleError("video", where(index, rec.id) + ": video '" + rel + "': " + e.what());
  };
  for (const auto& rel : rec.videos) {
    const std::string path = resolve(rel);
    try {
      video_spans.push_back(config_.video_preparer->plan(path, config_.max_image_pixels).tokens);
    } catch (const std::exception& e) {
      throw video_error(rel, e);
    }
  }
  out.sample = make_sample(rec, index, *encoder_, config_.sample, where(index, rec.id), spans, video_spans);
  if (decode_images) {
    for (const auto& rel : out.sample.videos) {
      try {
        NativeVideo v = config_.video_preparer->prepare(resolve(rel), config_.max_image_pixels);
        out.video_pixels.push_back(std::move(v.patches.pixel_values));
        out.video_grids.push_back(v.patches.grid_thw);
        out.video_seconds.push_back(v.second_per_grid_ts);
      } catch (const std::exception& e) {
        throw video_error(rel, e);
      }
    }
  }
  for (const auto& rel : out.sample.images) {
    const std::string path = resolve(rel);
    try {
      if (decode_images) {
        PreparedImage img =
            preparer_->prepare_among(decode_image_file(path, config_.max_image_pixels), rec.images.size());
        out.pixels.push_back(std::move(img.pixels));
        if (img.native()) out.grids.push_back(img.grid_thw);
        if (img.anyres()) out.image_sizes.push_back(img.image_size);
      } else if (!preparer_->size_dependent()) {
        probe_image_file(path, config_.max_image_pixels);  // exists, readable, a known format, within the limit
      }
    } catch (const std::exception& e) {
      throw image_error(rel, e);
    }
  }
  return out;
}

bool Dataset::try_prepare(size_t index, PreparedSample& out, BadRecord& bad, bool decode_images) const {
  try {
    out = prepare(index, decode_images);
    return true;
  } catch (const SampleError& e) {
    bad.index = index;
    bad.reason = e.reason();
    bad.message = e.what();
    bad.id.clear();
    // The id is in the message; fetch it again cheaply for statistics when the record parses at all.
    try {
      bad.id = records_->get(index).id;
    } catch (const RecordError& re) {
      bad.id = re.id();
    }
    return false;
  }
}

namespace {
const char* const kLengthsTag = "modality_lengths.v1";
}  // namespace

std::vector<int64_t> Dataset::compute_modality_lengths(size_t begin, size_t end, unsigned threads) const {
  if (begin > end || end > size())
    throw std::out_of_range(config_.data_path + ": modality lengths of records [" + std::to_string(begin) + ", " +
                            std::to_string(end) + ") asked, the file has " + std::to_string(size()));
  std::vector<int64_t> out = compute_record_lengths(*records_, begin, end, threads);
  lengths_parsed_ += end - begin;
  return out;
}

bool Dataset::load_cached_modality_lengths() const {
  std::lock_guard<std::mutex> lock(lengths_mutex_);
  if (!lengths_held_) lengths_held_ = records_->load_derived(kLengthsTag, lengths_);
  return lengths_held_;
}

bool Dataset::adopt_modality_lengths(std::vector<int64_t> lengths, bool write_cache) const {
  if (lengths.size() != size())
    throw std::invalid_argument(config_.data_path + ": " + std::to_string(lengths.size()) +
                                " modality lengths given for " + std::to_string(size()) + " records");
  std::lock_guard<std::mutex> lock(lengths_mutex_);
  if (lengths_held_) return false;
  const bool written = write_cache && records_->write_derived(kLengthsTag, lengths);
  lengths_ = std::move(lengths);
  lengths_held_ = true;
  return written;
}

// The lengths come from `<file>.gmodidx.modality_lengths.v1` when it matches the file (records.h: invalidated with
// the index); otherwise every record is read once, on all cores (data/record_lengths.h), and the cache written for
// the next start.
const std::vector<int64_t>& Dataset::modality_lengths() const {
  if (load_cached_modality_lengths()) return lengths_;
  adopt_modality_lengths(compute_modality_lengths(0, size(), std::thread::hardware_concurrency()), true);
  return lengths_;
}

}  // namespace gmod

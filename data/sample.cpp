// Templating + truncation of one record.
#include "data/sample.h"

#include <algorithm>

namespace gmod {

TruncationMode parse_truncation_mode(const std::string& s) {
  if (s == "turn") return TruncationMode::kTurnBoundary;
  if (s == "skip") return TruncationMode::kSkip;
  throw std::invalid_argument("truncation mode must be \"turn\" or \"skip\", got \"" + s + "\"");
}

TokenizedSample make_sample(const Record& record, size_t index, const ConversationEncoder& encoder,
                            const SampleConfig& config, const std::string& where,
                            const std::vector<ImageTokens>& image_tokens,
                            const std::vector<VideoTokens>& video_tokens) {
  EncodedConversation enc = encoder.encode(record, where, image_tokens, video_tokens);
  TokenizedSample s;
  s.id = record.id;
  s.index = index;
  size_t keep = enc.ids.size();
  if (keep > static_cast<size_t>(config.max_len)) {
    const std::string len_msg = "sequence of " + std::to_string(enc.ids.size()) +
                                " tokens (with images) exceeds max_len " + std::to_string(config.max_len);
    if (config.truncation == TruncationMode::kSkip) throw SampleError("too_long", where + ": " + len_msg);
    keep = 0;
    for (size_t e : enc.round_ends)
      if (e <= static_cast<size_t>(config.max_len)) keep = e;
    if (keep == 0)
      throw SampleError("too_long", where + ": " + len_msg + " and its first round does not fit");
    s.truncated = true;
  }
  // Images kept = image spans fully inside the kept prefix (a round end never falls inside a span).
  const auto kept = [keep](size_t end) { return end <= keep; };
  const size_t n_images = static_cast<size_t>(std::count_if(enc.image_ends.begin(), enc.image_ends.end(), kept));
  s.images.assign(record.images.begin(), record.images.begin() + std::min(n_images, record.images.size()));
  const size_t n_videos = static_cast<size_t>(std::count_if(enc.video_ends.begin(), enc.video_ends.end(), kept));
  s.videos.assign(record.videos.begin(), record.videos.begin() + std::min(n_videos, record.videos.size()));
  enc.ids.resize(keep);
  enc.labels.resize(keep);
  enc.roles.resize(keep);
  s.ids = std::move(enc.ids);
  s.labels = std::move(enc.labels);
  s.roles = std::move(enc.roles);
  return s;
}

}  // namespace gmod

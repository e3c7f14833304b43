// One training sample: a Record templated, tokenised, image-expanded and truncated to max_len.
#pragma once

#include <string>
#include <vector>

#include "data/conversation.h"

namespace gmod {

enum class TruncationMode {
  kTurnBoundary,  // keep the longest prefix of whole question/answer rounds that fits; skip if round 1 does
                  // not fit
  kSkip,          // skip every sample longer than max_len
};

// "turn" or "skip"; throws std::invalid_argument otherwise.
TruncationMode parse_truncation_mode(const std::string& s);

struct SampleConfig {
  int max_len = 2048;  // after image expansion
  TruncationMode truncation = TruncationMode::kTurnBoundary;
};

struct TokenizedSample {
  std::vector<int32_t> ids;
  std::vector<int32_t> labels;  // kIgnoreIndex where not supervised
  std::vector<TokenRole> roles;
  std::vector<std::string> images;  // image paths as written in the record, in order of occurrence
  std::vector<std::string> videos;  // the same for videos (kept with the rounds that hold them)
  std::string id;
  size_t index = 0;        // global record index
  bool truncated = false;  // rounds were dropped to fit max_len
};

// Templating + truncation. The cut is always at a round end, so an image span is never split; images of
// dropped rounds are dropped too. Throws SampleError (reason "too_long" when it cannot fit).
// `image_tokens`: each record image's tokens (ConversationEncoder::encode); empty = the encoder's fixed-size images.
TokenizedSample make_sample(const Record& record, size_t index, const ConversationEncoder& encoder,
                            const SampleConfig& config, const std::string& where,
                            const std::vector<ImageTokens>& image_tokens = {},
                            const std::vector<VideoTokens>& video_tokens = {});

}  // namespace gmod

// Role of every position of a spliced multimodal sequence. The data pipeline produces them; MoD
// routing derives its routable / forced-keep masks from them. Stored as int8 tensors [B, L].
#pragma once

#include <cstdint>

namespace gmod {

enum class TokenRole : int8_t {
  kPad = 0,       // right padding
  kSystem = 1,    // BOS, system prompt, template text before the first user turn
  kImage = 2,     // spliced image patch features
  kQuestion = 3,  // user turns including the template's role markers ("USER:", " ASSISTANT:")
  kAnswer = 4,    // assistant answers and their end-of-turn token (the supervised tokens)
};

}  // namespace gmod

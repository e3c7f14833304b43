// `gmod serve`: a parsed chat request turned into what the model decodes: the conversation template's tokens
// up to where the assistant's answer starts (as `gmod generate` and training build them) and the preprocessed
// images. Runs on the HTTP thread, so bad images and prompts over the context are answered before queueing.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "data/conversation.h"
#include "data/dataset.h"
#include "serve/chat_request.h"

namespace gmod::serve {

struct PreparedPrompt {
  std::vector<int64_t> ids;   // BOS, system prompt, image tokens, turns, " ASSISTANT:"
  std::vector<int8_t> roles;  // TokenRole per id (MoD routing)
  at::Tensor pixels;          // [N_images, 3, S, S] fp32 on the CPU, or native-resolution patches [rows, C*T*P*P];
                              // undefined without images
  at::Tensor image_grid_thw;  // [N_images, 3] with native-resolution patches (data/image_prep.h); else undefined
  at::Tensor image_sizes;     // [N_images, 2] (height, width) with AnyRes tiles [tiles, 3, S, S] in pixels; else undefined
};

// Throws ApiError(400) for a conversation the template cannot encode (roles not alternating user/assistant,
// a system message not first, <image> placeholders typed as text), an image that does not decode or has more
// than max_image_pixels pixels, or a model without a vision tower given images.
PreparedPrompt prepare_prompt(const ChatRequest& req, const ConversationEncoder& encoder,
                              const DatasetConfig& dc, bool has_vision, int64_t max_image_pixels);

}  // namespace gmod::serve

// The prompt of a one-turn question for the inference commands (generate, answer): the conversation
// template's tokens up to where the assistant's answer starts, with each image expanded to the model's image
// tokens. Header-only so the launch/ glob stays one file per subcommand.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "data/conversation.h"

namespace gmod::cli {

struct Prompt {
  std::vector<int32_t> ids;
  std::vector<TokenRole> roles;
};

// The record is encoded with a placeholder answer and cut at its first supervised token, so the prefix is
// exactly what the training template produces (BOS, system prompt, image tokens, " USER: ... ASSISTANT:").
// Without <image> placeholders the images go before the text ("<image>\n" + text, as LLaVA's answering
// scripts put them); with placeholders their count must equal `n_images`.
inline Prompt build_prompt(const ConversationEncoder& enc, std::string text, size_t n_images,
                           const std::string& where = "--prompt") {
  size_t placeholders = 0;
  for (size_t p = text.find("<image>"); p != std::string::npos; p = text.find("<image>", p + 1))
    ++placeholders;
  if (placeholders == 0)
    for (size_t i = 0; i < n_images; ++i) text = "<image>\n" + text;
  else if (placeholders != n_images)
    throw std::invalid_argument(where + " has " + std::to_string(placeholders) +
                                " <image> placeholders but " + std::to_string(n_images) +
                                " images were given");
  Record r;
  r.id = "prompt";
  r.images.assign(n_images, "image");
  r.conversations = {{"human", text}, {"gpt", "x"}};
  const EncodedConversation e = enc.encode(r, where);
  size_t start = 0;
  while (start < e.labels.size() && e.labels[start] == kIgnoreIndex) ++start;
  Prompt p;
  p.ids.assign(e.ids.begin(), e.ids.begin() + start);
  p.roles.assign(e.roles.begin(), e.roles.begin() + start);
  return p;
}

}  // namespace gmod::cli

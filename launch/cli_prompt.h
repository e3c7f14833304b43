// The prompt of a one-turn question for the inference commands (generate, answer): the conversation
// template's tokens up to where the assistant's answer starts, with each image expanded to the model's image
// tokens. Header-only so the launch/ glob stays one file per subcommand.
#pragma once

#include <torch/torch.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "data/conversation.h"
#include "data/image.h"
#include "data/image_prep.h"

namespace gmod::cli {

struct Prompt {
  std::vector<int32_t> ids;
  std::vector<TokenRole> roles;
};

// The record is encoded with a placeholder answer and cut at its first supervised token, so the prefix is
// exactly what the training template produces (BOS, system prompt, image tokens, " USER: ... ASSISTANT:").
// Without <image> placeholders the images go before the text ("<image>\n" + text, as LLaVA's answering
// scripts put them); with placeholders their count must equal `n_images`. `spans`: each image's tokens when they
// depend on its size (native-resolution images, ImagePreparer::tokens); empty = the encoder's fixed-size images.
inline Prompt build_prompt(const ConversationEncoder& enc, std::string text, size_t n_images,
                           const std::string& where = "--prompt", const std::vector<ImageTokens>& spans = {}) {
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
  const EncodedConversation e = spans.empty() ? enc.encode(r, where) : enc.encode(r, where, spans);
  size_t start = 0;
  while (start < e.labels.size() && e.labels[start] == kIgnoreIndex) ++start;
  Prompt p;
  p.ids.assign(e.ids.begin(), e.ids.begin() + start);
  p.roles.assign(e.roles.begin(), e.roles.begin() + start);
  return p;
}

// A prompt's decoded images as the model takes them, through the model's image preparer (data/image_prep.h): each
// image's tokens in the prompt (only when they depend on its size, else empty) and the pixel values as the collator
// lays them out: crops [N, 3, S, S], patches [rows, C*T*P*P] with image_grid_thw [N, 3], or AnyRes tiles
// [tiles, 3, S, S] with image_sizes [N, 2].
struct PromptImages {
  std::vector<ImageTokens> spans;
  at::Tensor pixel_values, image_grid_thw, image_sizes;
};

inline PromptImages prepare_prompt_images(const ImagePreparer& prep, const std::vector<Image>& images, int crop) {
  PromptImages out;
  if (images.empty()) return out;
  std::vector<at::Tensor> pixels;
  std::vector<int64_t> grids, sizes;
  for (const Image& img : images) {
    if (prep.size_dependent()) out.spans.push_back(prep.tokens_among(img.width, img.height, images.size()));
    const PreparedImage p = prep.prepare_among(img, images.size());
    const int64_t n = static_cast<int64_t>(p.pixels.size());
    at::Tensor t = at::from_blob(const_cast<float*>(p.pixels.data()), {n}, at::kFloat).clone();
    if (p.native()) {
      const int64_t rows = p.grid_thw[0] * p.grid_thw[1] * p.grid_thw[2];
      pixels.push_back(t.view({rows, n / rows}));
      grids.insert(grids.end(), p.grid_thw.begin(), p.grid_thw.end());
    } else if (p.anyres()) {
      pixels.push_back(t.view({-1, 3, crop, crop}));
      sizes.insert(sizes.end(), p.image_size.begin(), p.image_size.end());
    } else {
      pixels.push_back(t.view({1, 3, crop, crop}));
    }
  }
  out.pixel_values = at::cat(pixels);  // the preparer makes one kind for all images
  if (!grids.empty()) out.image_grid_thw = at::tensor(grids, at::kLong).view({-1, 3});
  if (!sizes.empty()) out.image_sizes = at::tensor(sizes, at::kLong).view({-1, 2});
  return out;
}

}  // namespace gmod::cli

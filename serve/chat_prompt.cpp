#include "serve/chat_prompt.h"

#include <algorithm>

#include "data/image.h"
#include "data/image_prep.h"

namespace gmod::serve {

namespace {
ApiError bad(const std::string& message, const std::string& param = "messages") {
  return ApiError(400, "invalid_request_error", message, param);
}
}  // namespace

PreparedPrompt prepare_prompt(const ChatRequest& req, const ConversationEncoder& encoder,
                              const DatasetConfig& dc, bool has_vision, int64_t max_image_pixels) {
  Record r;
  r.id = "request";
  r.images.assign(req.images.size(), "image");
  ConversationConfig cc = encoder.config();
  bool system = false;
  size_t placeholders = 0;
  for (size_t i = 0; i < req.messages.size(); ++i) {
    const ChatMessage& m = req.messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    for (size_t p = m.text.find("<image>"); p != std::string::npos; p = m.text.find("<image>", p + 1))
      ++placeholders;
    if (m.role == "system") {
      if (i != 0) throw bad(where + ": a system message is served only as the first message", where);
      cc.system_prompt = m.text;
      system = true;
      continue;
    }
    const bool human = m.role == "user";
    const bool want_human = r.conversations.empty() || r.conversations.back().from == "gpt";
    if (human != want_human)
      throw bad(where + ": messages must alternate user and assistant, starting with user", where);
    r.conversations.push_back({human ? "human" : "gpt", m.text});
  }
  if (r.conversations.empty() || r.conversations.back().from != "human")
    throw bad("the last message must be a user message");
  if (placeholders != req.images.size())
    throw bad("the text holds " + std::to_string(placeholders) + " <image> markers for " +
              std::to_string(req.images.size()) + " image parts (images go in image_url parts only)");
  if (!req.images.empty() && !has_vision) throw bad("the served model has no vision tower: send text only");
  r.conversations.push_back({"gpt", "x"});  // a placeholder answer: the prompt ends where it starts

  // The images through the model's preparer (data/image_prep.h): fixed-size crops, or native-resolution patches
  // whose token counts follow each image's size (then the template needs them).
  // (As Dataset: without one, CLIP crops with the conversation's image tokens.)
  const auto preparer = dc.image_preparer ? dc.image_preparer
                                          : make_clip_image_preparer(dc.image, dc.conversation.image_token_id,
                                                                     std::max(dc.conversation.image_seq_length, 1));
  const ImagePreparer& prep = *preparer;
  std::vector<ImageTokens> spans;
  std::vector<at::Tensor> pixels;
  std::vector<int64_t> grids, sizes;
  for (const ChatImage& img : req.images) {
    PreparedImage px;
    try {
      const Image decoded = decode_image_memory(img.bytes.data(), img.bytes.size(), img.where, max_image_pixels);
      if (prep.size_dependent())
        spans.push_back(prep.tokens_among(decoded.width, decoded.height, req.images.size()));
      px = prep.prepare_among(decoded, req.images.size());
    } catch (const std::exception& ex) {
      throw bad(ex.what(), img.where + ".image_url");
    }
    const int64_t n = int64_t(px.pixels.size());
    at::Tensor t = at::from_blob(px.pixels.data(), {n}, at::kFloat).clone();
    if (px.native()) {
      const int64_t rows = px.grid_thw[0] * px.grid_thw[1] * px.grid_thw[2];
      pixels.push_back(t.view({rows, n / rows}));
      grids.insert(grids.end(), px.grid_thw.begin(), px.grid_thw.end());
    } else if (px.anyres()) {
      pixels.push_back(t.view({-1, 3, dc.image.crop, dc.image.crop}));
      sizes.insert(sizes.end(), px.image_size.begin(), px.image_size.end());
    } else {
      pixels.push_back(t.view({1, 3, dc.image.crop, dc.image.crop}));
    }
  }

  EncodedConversation e;
  try {
    const auto encode = [&](const ConversationEncoder& enc) {
      return spans.empty() ? enc.encode(r, "request") : enc.encode(r, "request", spans);
    };
    e = system ? encode(ConversationEncoder(
                     std::shared_ptr<const Tokenizer>(&encoder.tokenizer(), [](const Tokenizer*) {}), cc))
               : encode(encoder);
  } catch (const std::exception& ex) {
    throw bad(std::string("the conversation does not encode: ") + ex.what());
  }
  // The start of the last supervised span: the placeholder answer.
  size_t start = e.labels.size();
  while (start > 0 && e.labels[start - 1] == kIgnoreIndex) --start;  // past the last supervised token
  if (start == 0) throw bad("the conversation was truncated before the answer (too long)");
  while (start > 0 && e.labels[start - 1] != kIgnoreIndex) --start;  // to the first token of its span
  PreparedPrompt p;
  p.ids.assign(e.ids.begin(), e.ids.begin() + static_cast<std::ptrdiff_t>(start));
  for (size_t i = 0; i < start; ++i) p.roles.push_back(static_cast<int8_t>(e.roles[i]));

  if (!pixels.empty()) p.pixels = at::cat(pixels);
  if (!grids.empty()) p.image_grid_thw = at::tensor(grids, at::kLong).view({-1, 3});
  if (!sizes.empty()) p.image_sizes = at::tensor(sizes, at::kLong).view({-1, 2});
  return p;
}

}  // namespace gmod::serve

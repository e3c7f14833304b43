// Record -> prompt pieces (text with a role, fixed tokens, images) -> ids / labels / roles.
#include "data/conversation.h"

#include <algorithm>

#include "model/config.h"

namespace gmod {

const char* const kVicunaSystem =
    "A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
    "detailed, and polite answers to the user's questions.";
const char* const kChatmlSystem = "You are a helpful assistant.";
const char* const kQwen25System = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
const char* const kLlama3System =
    "You are a helpful language and vision assistant. You are able to understand the visual content that "
    "the user provides, and assist the user with a variety of tasks using natural language.";
const char* const kLlama31Preamble = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";

namespace {
const char* const kTemplates[] = {"vicuna_v1", "plain",  "chatml",   "qwen2_5",
                                  "qwen3_vl",  "llama3", "llama3_1", "mistral"};
bool is_template(const std::string& name) {
  return std::find(std::begin(kTemplates), std::end(kTemplates), name) != std::end(kTemplates);
}
}  // namespace

bool is_conversation_template(const std::string& name) { return name == "auto" || is_template(name); }

const char* conversation_template_list() {
  return "vicuna_v1, plain, chatml, qwen2_5, qwen3_vl, llama3, llama3_1, mistral or auto (the model family's)";
}

// LLaMA-3's 128256-id vocabulary tells it from LLaMA-1/2 (32000); its 3.1+ releases use rope_scaling llama3.
std::string resolve_conversation_template(const std::string& name, const LlamaConfig& llm) {
  if (name != "auto") return name;
  switch (llm.family) {
    case LlmFamily::kQwen2:  // Qwen3-VL's text model (interleaved M-RoPE) has its own template
      return llm.mrope_interleaved ? "qwen3_vl" : "chatml";
    case LlmFamily::kMistral:
      return "mistral";
    case LlmFamily::kLlama:
      break;
  }
  if (llm.vocab_size >= 128000) return llm.rope_scaling.type == "llama3" ? "llama3_1" : "llama3";
  return "vicuna_v1";
}

namespace {

const std::string kImagePlaceholder = "<image>";
// LLaVA-Video / LLaMA-Factory's video placeholder; a video's span goes where it stands (never moved to the front).
const std::string kVideoPlaceholder = "<video>";

struct Piece {
  enum Kind { kText, kToken, kImage, kVideo } kind = kText;
  std::string text;
  int32_t id = 0;
  TokenRole role = TokenRole::kQuestion;
  bool supervised = false;
  bool hard_end = false;   // ends with a special token: tokenisation restarts after it
  bool round_end = false;  // a question/answer round is complete after this piece
};

std::string strip(const std::string& s) {
  const char* ws = " \t\n\r\v\f";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

size_t count_placeholders(const std::string& s, const std::string& placeholder = kImagePlaceholder) {
  size_t n = 0;
  for (size_t p = s.find(placeholder); p != std::string::npos; p = s.find(placeholder, p + 1)) ++n;
  return n;
}

std::string remove_placeholders(std::string s) {
  for (size_t p; (p = s.find(kImagePlaceholder)) != std::string::npos;) s.erase(p, kImagePlaceholder.size());
  return s;
}

// Appends `text` as text pieces, with an image piece at every `<image>` and a video piece at every `<video>`. Flags
// apply to the last text piece.
void add_text(std::vector<Piece>& out, const std::string& text, TokenRole role, bool supervised = false,
              bool hard_end = false, bool round_end = false) {
  size_t pos = 0;
  while (true) {
    const size_t pi = text.find(kImagePlaceholder, pos), pv = text.find(kVideoPlaceholder, pos);
    const size_t p = std::min(pi, pv);
    if (p == std::string::npos) break;
    const bool video = pv < pi;
    out.push_back({Piece::kText, text.substr(pos, p - pos), 0, role, supervised});
    out.push_back({video ? Piece::kVideo : Piece::kImage, "", 0, TokenRole::kImage});
    pos = p + (video ? kVideoPlaceholder : kImagePlaceholder).size();
  }
  out.push_back({Piece::kText, text.substr(pos), 0, role, supervised, hard_end, round_end});
}

}  // namespace

ConversationEncoder::ConversationEncoder(std::shared_ptr<const Tokenizer> tokenizer,
                                         ConversationConfig config)
    : tok_(std::move(tokenizer)), config_(std::move(config)) {
  if (!tok_) throw std::invalid_argument("ConversationEncoder: no tokenizer");
  const std::string& t = config_.template_name;
  if (t == "auto")
    throw std::invalid_argument(
        "conversation template 'auto' is resolved from the model's family first "
        "(resolve_conversation_template)");
  if (!is_template(t))
    throw std::invalid_argument("unknown conversation template '" + t + "' (expected " +
                                conversation_template_list() + ")");
  if (config_.image_seq_length < 1)
    throw std::invalid_argument("ConversationEncoder: image_seq_length must be >= 1, got " +
                                std::to_string(config_.image_seq_length));
  auto need = [&](std::initializer_list<const char*> tokens) {
    for (const char* s : tokens)
      if (!tok_->token_to_id(s))
        throw std::invalid_argument("template " + t + " needs the token " + s + " in the tokenizer");
  };
  if (t == "chatml" || t == "qwen2_5" || t == "qwen3_vl") {
    need({"<|im_start|>", "<|im_end|>"});
    pad_id_ = config_.pad_id.value_or(tok_->pad_id().value_or(tok_->eos_id().value_or(0)));
  } else if (t == "llama3" || t == "llama3_1") {
    need({"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"});
    bos_ = tok_->token_to_id("<|begin_of_text|>");
    pad_id_ = config_.pad_id.value_or(tok_->pad_id().value_or(tok_->eos_id().value_or(0)));
  } else {
    bos_ = tok_->bos_id();
    if (!bos_) throw std::invalid_argument("template " + t + " needs a BOS token in the tokenizer");
    if (t == "vicuna_v1") need({"</s>"});
    if (t == "mistral") {
      eos_ = tok_->eos_id();
      if (!eos_) throw std::invalid_argument("template mistral needs an EOS token in the tokenizer");
    }
    pad_id_ = config_.pad_id.value_or(tok_->unk_id().value_or(tok_->pad_id().value_or(0)));
  }
}

std::optional<int32_t> ConversationEncoder::end_of_turn_id() const {
  const std::string& t = config_.template_name;
  if (t == "chatml" || t == "qwen2_5" || t == "qwen3_vl") return tok_->token_to_id("<|im_end|>");
  if (t == "llama3" || t == "llama3_1") return tok_->token_to_id("<|eot_id|>");
  if (t == "vicuna_v1") return tok_->token_to_id("</s>");
  return tok_->eos_id();
}

EncodedConversation ConversationEncoder::encode(const Record& record, const std::string& where) const {
  return encode(record, where, {});
}

EncodedConversation ConversationEncoder::encode(const Record& record, const std::string& where,
                                                const std::vector<ImageTokens>& image_tokens,
                                                const std::vector<VideoTokens>& video_tokens) const {
  auto fail = [&](const std::string& reason, const std::string& why) {
    throw SampleError(reason, where + ": " + why);
  };
  // Roles: a leading assistant turn is dropped (as LLaVA does), then turns must alternate human/gpt.
  std::vector<Turn> turns = record.conversations;
  if (!turns.empty() && turns.front().from != "human") turns.erase(turns.begin());
  for (size_t k = 0; k < turns.size(); ++k) {
    const char* want = k % 2 == 0 ? "human" : "gpt";
    if (turns[k].from != want)
      fail("roles", "turn " + std::to_string(k) + " is from \"" + turns[k].from + "\", expected \"" + want +
                        "\" (turns must alternate human/gpt)");
  }
  if (turns.size() % 2 == 1) turns.pop_back();  // unanswered final question
  if (turns.empty()) fail("no_answer", "no assistant turn");
  size_t placeholders = 0;
  for (auto& t : turns) {
    const size_t n = count_placeholders(t.value);
    placeholders += n;
    if (n > 0 && config_.image_first) {
      std::string front;
      for (size_t i = 0; i < n; ++i) front += kImagePlaceholder + "\n";
      t.value = strip(front + strip(remove_placeholders(t.value)));
    }
  }
  if (placeholders != record.images.size())
    fail("placeholder", std::to_string(placeholders) + " <image> placeholder(s) but " +
                            std::to_string(record.images.size()) + " image(s)");
  size_t video_placeholders = 0;
  for (const auto& t : turns) video_placeholders += count_placeholders(t.value, kVideoPlaceholder);
  if (video_placeholders != record.videos.size())
    fail("placeholder", std::to_string(video_placeholders) + " <video> placeholder(s) but " +
                            std::to_string(record.videos.size()) + " video(s)");
  if (video_tokens.size() != record.videos.size())
    throw std::invalid_argument(where + ": " + std::to_string(video_tokens.size()) + " video token spans given for " +
                                std::to_string(record.videos.size()) + " video(s)");
  if (!image_tokens.empty() && image_tokens.size() != record.images.size())
    throw std::invalid_argument(where + ": " + std::to_string(image_tokens.size()) + " image token spans given for " +
                                std::to_string(record.images.size()) + " image(s)");
  for (size_t k = 1; k < turns.size(); k += 2)
    if (strip(turns[k].value).empty()) fail("no_answer", "turn " + std::to_string(k) + ": empty answer");

  std::vector<Piece> pieces;
  const std::string& tname = config_.template_name;
  if (tname == "vicuna_v1") {
    pieces.push_back({Piece::kToken, "", *bos_, TokenRole::kSystem});
    add_text(pieces, config_.system_prompt.value_or(kVicunaSystem), TokenRole::kSystem);
    for (size_t k = 0; k < turns.size(); k += 2) {
      add_text(pieces, std::string(k == 0 ? " " : "") + "USER: " + turns[k].value + " ASSISTANT:",
               TokenRole::kQuestion);
      add_text(pieces, " " + turns[k + 1].value + "</s>", TokenRole::kAnswer, true, true, true);
    }
  } else if (tname == "plain") {
    // LLaVA preprocess_plain: exactly one human turn holding the image, one caption.
    if (turns.size() != 2 || record.images.size() != 1 || count_placeholders(turns[0].value) != 1)
      fail("placeholder", "template plain needs one human turn with one <image> and one answer");
    pieces.push_back({Piece::kToken, "", *bos_, TokenRole::kSystem});
    pieces.push_back({Piece::kImage, "", 0, TokenRole::kImage});
    add_text(pieces, turns[1].value + "\n", TokenRole::kAnswer, true, false, true);
  } else if (tname == "llama3" || tname == "llama3_1") {
    // The template strips every message (`| trim`); a system block only when there is something to say,
    // except 3.1's, which always carries the date lines.
    const std::string system = strip(config_.system_prompt.value_or(kLlama3System));
    pieces.push_back({Piece::kToken, "", *bos_, TokenRole::kSystem});
    if (tname == "llama3_1" || !system.empty())
      add_text(pieces,
               "<|start_header_id|>system<|end_header_id|>\n\n" +
                   std::string(tname == "llama3_1" ? kLlama31Preamble : "") + system + "<|eot_id|>",
               TokenRole::kSystem);
    for (size_t k = 0; k < turns.size(); k += 2) {
      add_text(pieces,
               "<|start_header_id|>user<|end_header_id|>\n\n" + strip(turns[k].value) +
                   "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
               TokenRole::kQuestion);
      add_text(pieces, strip(turns[k + 1].value) + "<|eot_id|>", TokenRole::kAnswer, true, true, true);
    }
  } else if (tname == "mistral") {
    const std::string system = config_.system_prompt.value_or("");
    pieces.push_back({Piece::kToken, "", *bos_, TokenRole::kSystem});
    for (size_t k = 0; k < turns.size(); k += 2) {
      if (k == 0 && !system.empty()) {
        add_text(pieces, "[INST] " + system + "\n\n", TokenRole::kSystem);
        add_text(pieces, turns[k].value + " [/INST]", TokenRole::kQuestion);
      } else {
        add_text(pieces, "[INST] " + turns[k].value + " [/INST]", TokenRole::kQuestion);
      }
      add_text(pieces, turns[k + 1].value, TokenRole::kAnswer, true);
      pieces.push_back({Piece::kToken, "", *eos_, TokenRole::kAnswer, true, true, true});
    }
  } else {  // chatml, qwen2_5, qwen3_vl (no system block unless one is set)
    const char* default_system = tname == "qwen2_5" ? kQwen25System : kChatmlSystem;
    if (tname != "qwen3_vl" || config_.system_prompt)
      add_text(pieces, "<|im_start|>system\n" + config_.system_prompt.value_or(default_system) + "<|im_end|>\n",
               TokenRole::kSystem);
    for (size_t k = 0; k < turns.size(); k += 2) {
      add_text(pieces,
               std::string(k == 0 ? "" : "\n") + "<|im_start|>user\n" + turns[k].value +
                   "<|im_end|>\n<|im_start|>assistant\n",
               TokenRole::kQuestion);
      add_text(pieces, turns[k + 1].value + "<|im_end|>", TokenRole::kAnswer, true, true, true);
    }
    add_text(pieces, "\n", TokenRole::kQuestion);
  }

  EncodedConversation out;
  auto push = [&out](int32_t id, TokenRole role, bool supervised) {
    out.ids.push_back(id);
    out.labels.push_back(supervised ? id : kIgnoreIndex);
    out.roles.push_back(role);
  };
  for (size_t i = 0; i < pieces.size();) {
    const Piece& p = pieces[i];
    if (p.kind == Piece::kToken) {
      push(p.id, p.role, p.supervised);
      if (p.round_end) out.round_ends.push_back(out.ids.size());
      ++i;
      continue;
    }
    if (p.kind == Piece::kImage) {
      // Start / end tokens (native-resolution images) belong to the turn around the image, never supervised.
      const TokenRole around = i > 0 ? pieces[i - 1].role : TokenRole::kQuestion;
      if (image_tokens.empty()) {
        for (int k = 0; k < config_.image_seq_length; ++k) push(config_.image_token_id, TokenRole::kImage, false);
      } else {
        const ImageTokens& span = image_tokens[size_t(out.num_images)];
        if (span.start) push(*span.start, around, false);
        for (int64_t k = 0; k < span.count; ++k) push(span.id, TokenRole::kImage, false);
        if (span.end) push(*span.end, around, false);
      }
      out.image_ends.push_back(out.ids.size());
      ++out.num_images;
      ++i;
      continue;
    }
    if (p.kind == Piece::kVideo) {  // the family's layout of the video's tokens (data/video_layout.h)
      const TokenRole around = i > 0 ? pieces[i - 1].role : TokenRole::kQuestion;
      const VideoTokens& span = video_tokens[out.video_ends.size()];
      for (int32_t id : span.ids) push(id, id == span.id ? TokenRole::kImage : around, false);
      out.video_ends.push_back(out.ids.size());
      ++i;
      continue;
    }
    // A chunk: text pieces up to the next image / fixed token, or through a piece ending in a special token.
    size_t j = i;
    std::string chunk;
    do {
      chunk += pieces[j].text;
      ++j;
    } while (j < pieces.size() && pieces[j].kind == Piece::kText && !pieces[j - 1].hard_end);
    const std::vector<int32_t> full = chunk.empty() ? std::vector<int32_t>{} : tok_->encode(chunk);
    std::string prefix;
    size_t prev = 0;
    for (size_t m = i; m < j; ++m) {
      prefix += pieces[m].text;
      size_t end = full.size();
      if (m + 1 < j)
        end = std::max(prev, std::min(full.size(), prefix.empty() ? 0 : tok_->encode(prefix).size()));
      for (size_t t = prev; t < end; ++t) push(full[t], pieces[m].role, pieces[m].supervised);
      prev = end;
      if (pieces[m].round_end) out.round_ends.push_back(out.ids.size());
    }
    i = j;
  }
  if (std::none_of(out.labels.begin(), out.labels.end(), [](int32_t l) { return l != kIgnoreIndex; }))
    fail("no_answer", "no supervised token after templating");
  return out;
}

}  // namespace gmod

// `gmod serve`: an OpenAI chat-completions request body parsed and validated (docs/serve.md). Every problem
// is an ApiError carrying the HTTP status and OpenAI's error shape ({"error": {"message", "type", "param",
// "code"}}), so the HTTP glue (serve/http_api.cpp) answers it as JSON and keeps serving. Torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace gmod::serve {

// An error answered to the client: status 400 (invalid_request_error), 401, 404, 429, 500 or 503.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string type, const std::string& message, std::string param = {},
           std::string code = {})
      : std::runtime_error(message),
        status(status),
        type(std::move(type)),
        param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type;             // invalid_request_error, authentication_error, rate_limit_error, server_error
  std::string param;            // the request field at fault ("messages[1].content[0].image_url"), or empty
  std::string code;             // e.g. context_length_exceeded, or empty
  std::string to_json() const;  // {"error": {...}}
};

struct ChatImage {
  std::vector<uint8_t> bytes;  // the decoded base64 payload or the local file's bytes (PNG or JPEG)
  std::string where;           // "messages[0].content[1]" for error messages
};

// One message; its text has "<image>\n" where each image part was (the conversation template's placeholder).
struct ChatMessage {
  std::string role;  // system, user or assistant
  std::string text;
};

struct ChatRequest {
  std::string model;  // optional; checked against the served model's name when given
  std::vector<ChatMessage> messages;
  std::vector<ChatImage> images;  // in order of appearance
  std::optional<int64_t> max_tokens;
  std::optional<double> temperature, top_p;
  std::vector<std::string> stop;
  uint64_t seed = 0;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
};

// Limits the parser enforces before anything is decoded.
struct RequestLimits {
  size_t max_images = 8;
  size_t max_image_bytes = size_t(20) << 20;  // decoded base64 payload or file per image
  // Local images (file:///abs/path, /abs/path, or a path relative to this folder) are read only from under
  // this folder (symbolic links resolved); empty: local paths are refused.
  std::string allowed_image_dir;
};

// Parses a request body. Throws ApiError(400) for malformed JSON, unknown or ill-typed fields (OpenAI's
// fields gmod does not implement are accepted only with their neutral value: frequency_penalty and
// presence_penalty 0, logprobs false, response_format text; user is ignored), missing or empty messages,
// unsupported roles or content parts, image URLs that are neither base64 data URLs nor local paths under
// limits.allowed_image_dir, bad base64, values out of range (temperature in [0, 2], top_p in (0, 1],
// max_tokens >= 1, at most 4 stop strings, n == 1).
ChatRequest parse_chat_request(const std::string& body, const RequestLimits& limits = {});

// Standard base64 (RFC 4648, padding optional, no whitespace). Throws std::invalid_argument on a bad
// character.
std::vector<uint8_t> decode_base64(const std::string& text);

}  // namespace gmod::serve

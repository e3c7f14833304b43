// `gmod serve`: the HTTP glue (cpp-httplib from Debian's libcpp-httplib-dev) around BatchEngine: the routes
// /v1/chat/completions (with token-by-token server-sent events for stream: true), /v1/models, /health and
// /metrics, the optional API key, and every failure answered as JSON in OpenAI's error shape (docs/serve.md).
// A request whose client goes away (closed connection, write timeout) is cancelled in the engine. The server
// keeps serving after any bad request.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "serve/batch_engine.h"

namespace gmod::serve {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;      // 0: any free port (printed when listening)
  std::string api_key;  // empty: none required
  std::string model_name;
  size_t max_body_bytes = size_t(64) << 20;
  // Bodies over large_body_bytes being handled at once at most (more: 503, Retry-After), so a few huge requests
  // cannot take every HTTP thread and the memory their parsing needs.
  size_t large_body_bytes = size_t(1) << 20;
  int64_t max_large_bodies = 4;
  // Messages' text over this many bytes is first counted by serve/prompt_bound.h (the cheap context check).
  size_t bound_check_bytes = size_t(64) << 10;
  RequestLimits limits;
  int64_t max_image_pixels = 0;
  int write_timeout_s =
      10;  // a client that takes no bytes for this long is cut off (and its request cancelled)
  int read_timeout_s = 10;  // a request body that sends no bytes for this long is dropped
};

// Builds a PreparedPrompt for a parsed request (serve/chat_prompt.h with the model's encoder and image
// config).
using PromptBuilder = std::function<PreparedPrompt(const ChatRequest&)>;

class HttpApi {
 public:
  HttpApi(BatchEngine& engine, PromptBuilder build, std::shared_ptr<const Tokenizer> tokenizer,
          HttpOptions options);
  ~HttpApi();
  // Binds (throws std::runtime_error naming host:port when that fails) and returns the bound port.
  int bind();
  // Serves until stop(); returns false when the listening socket failed.
  bool serve();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gmod::serve

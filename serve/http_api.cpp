#include "serve/http_api.h"

#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace gmod::serve {

using nlohmann::json;

struct HttpApi::Impl {
  BatchEngine& engine;
  PromptBuilder build;
  std::shared_ptr<const Tokenizer> tokenizer;
  HttpOptions opt;
  httplib::Server server;
  std::atomic<int64_t> http_requests{0}, http_errors{0}, next_id{0};
  const std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

  Impl(BatchEngine& e, PromptBuilder b, std::shared_ptr<const Tokenizer> t, HttpOptions o)
      : engine(e), build(std::move(b)), tokenizer(std::move(t)), opt(std::move(o)) {}

  void error(httplib::Response& res, const ApiError& e) {
    ++http_errors;
    res.status = e.status;
    if (e.status == 429) res.set_header("Retry-After", "1");
    if (e.status == 401) res.set_header("WWW-Authenticate", "Bearer");
    res.set_content(e.to_json(), "application/json");
  }

  json completion_json(const Completion& c, const std::string& id, int64_t created) const {
    return {{"id", id},
            {"object", "chat.completion"},
            {"created", created},
            {"model", opt.model_name},
            {"choices", json::array({{{"index", 0},
                                      {"message", {{"role", "assistant"}, {"content", c.text}}},
                                      {"logprobs", nullptr},
                                      {"finish_reason", c.finish_reason}}})},
            {"usage",
             {{"prompt_tokens", c.prompt_tokens},
              {"completion_tokens", c.completion_tokens},
              {"total_tokens", c.prompt_tokens + c.completion_tokens}}}};
  }

  // stream: true answers server-sent events; the whole answer comes in one chunk once decoded (token-by-token
  // streaming needs continuous batching, not done yet).
  std::string sse(const Completion& c, const std::string& id, int64_t created) const {
    auto chunk = [&](const json& delta, const json& finish) {
      json j = {{"id", id},
                {"object", "chat.completion.chunk"},
                {"created", created},
                {"model", opt.model_name},
                {"choices",
                 json::array(
                     {{{"index", 0}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", finish}}})}};
      return "data: " + j.dump() + "\n\n";
    };
    return chunk({{"role", "assistant"}, {"content", c.text}}, nullptr) +
           chunk(json::object(), c.finish_reason) + "data: [DONE]\n\n";
  }

  void chat(const httplib::Request& req, httplib::Response& res) {
    const ChatRequest r = parse_chat_request(req.body, opt.limits);
    if (!r.model.empty() && r.model != opt.model_name)
      throw ApiError(
          404, "invalid_request_error",
          "the model '" + r.model + "' is not served here (this server serves '" + opt.model_name + "')",
          "model", "model_not_found");
    std::future<Completion> f = engine.submit(build(r), r, tokenizer);
    const Completion c = f.get();
    const std::string id = "chatcmpl-" + std::to_string(++next_id);
    const int64_t created =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    if (r.stream)
      res.set_content(sse(c, id, created), "text/event-stream");
    else
      res.set_content(completion_json(c, id, created).dump(), "application/json");
  }

  std::string metrics() const {
    const EngineMetrics m = engine.metrics();
    const double up = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    char buf[2048];
    std::snprintf(buf, sizeof buf,
                  "# gmod serve metrics (Prometheus text format)\n"
                  "gmod_http_requests_total %lld\ngmod_http_errors_total %lld\n"
                  "gmod_requests_completed_total %lld\ngmod_batches_total %lld\ngmod_max_batch_size %lld\n"
                  "gmod_prompt_tokens_total %lld\ngmod_completion_tokens_total %lld\n"
                  "gmod_decode_seconds_total %.6f\ngmod_decode_tokens_per_second %.3f\n"
                  "gmod_mod_skip_ratio %.6f\ngmod_queue_length %zu\ngmod_uptime_seconds %.3f\n",
                  static_cast<long long>(http_requests.load()), static_cast<long long>(http_errors.load()),
                  static_cast<long long>(m.requests), static_cast<long long>(m.batches),
                  static_cast<long long>(m.max_batch_seen), static_cast<long long>(m.prompt_tokens),
                  static_cast<long long>(m.completion_tokens), m.decode_seconds,
                  m.decode_seconds > 0 ? m.completion_tokens / m.decode_seconds : 0.0,
                  m.mod_total ? 1.0 - double(m.mod_processed) / m.mod_total : 0.0, m.queue_length, up);
    return buf;
  }

  // Runs a handler; any exception becomes a JSON error and the server carries on.
  template <class F>
  httplib::Server::Handler guarded(F f) {
    return [this, f](const httplib::Request& req, httplib::Response& res) {
      ++http_requests;
      try {
        f(req, res);
      } catch (const ApiError& e) {
        error(res, e);
      } catch (const std::exception& e) {
        error(res, ApiError(500, "server_error", e.what()));
      }
    };
  }

  void routes() {
    // Enough HTTP threads for every request the engine can hold (decoding + queued) and a few more, so that a
    // request over the queue is answered 429 at once instead of waiting for a thread.
    const size_t threads = size_t(engine.options().max_batch) + engine.options().max_queue + 4;
    server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    server.set_payload_max_length(opt.max_body_bytes);
    server.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (opt.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
      if (req.get_header_value("Authorization") != "Bearer " + opt.api_key) {
        ++http_requests;
        error(res, ApiError(401, "authentication_error",
                            "missing or wrong API key (Authorization: Bearer KEY)", {}, "invalid_api_key"));
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    server.Post("/v1/chat/completions", guarded([this](auto& q, auto& s) { chat(q, s); }));
    server.Get(
        "/v1/models", guarded([this](const httplib::Request&, httplib::Response& res) {
          json m = {
              {"object", "list"},
              {"data",
               json::array(
                   {{{"id", opt.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "gmod"}}})}};
          res.set_content(m.dump(), "application/json");
        }));
    server.Get("/health", guarded([](const httplib::Request&, httplib::Response& res) {
                 res.set_content("{\"status\": \"ok\"}", "application/json");
               }));
    server.Get("/metrics", guarded([this](const httplib::Request&, httplib::Response& res) {
                 res.set_content(metrics(), "text/plain; version=0.0.4");
               }));
    // Unknown paths, wrong methods, bodies over the limit: httplib sets the status; the body is OpenAI's
    // shape.
    server.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      const std::string msg = res.status == 404   ? "no route " + req.method + " " + req.path
                              : res.status == 413 ? "the body is over the server's limit of " +
                                                        std::to_string(opt.max_body_bytes) + " bytes"
                                                  : "HTTP " + std::to_string(res.status) + " for " + req.path;
      ++http_errors;
      res.set_content(ApiError(res.status, "invalid_request_error", msg).to_json(), "application/json");
    });
  }
};

HttpApi::HttpApi(BatchEngine& engine, PromptBuilder build, std::shared_ptr<const Tokenizer> tokenizer,
                 HttpOptions options)
    : impl_(std::make_unique<Impl>(engine, std::move(build), std::move(tokenizer), std::move(options))) {
  impl_->routes();
}

HttpApi::~HttpApi() = default;

int HttpApi::bind() {
  const int port =
      impl_->opt.port == 0
          ? impl_->server.bind_to_any_port(impl_->opt.host)
          : (impl_->server.bind_to_port(impl_->opt.host, impl_->opt.port) ? impl_->opt.port : -1);
  if (port <= 0)
    throw std::runtime_error("cannot listen on " + impl_->opt.host + ":" + std::to_string(impl_->opt.port) +
                             " (in use, or not an address of this machine)");
  return port;
}

bool HttpApi::serve() { return impl_->server.listen_after_bind(); }

void HttpApi::stop() { impl_->server.stop(); }

}  // namespace gmod::serve

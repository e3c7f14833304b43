#include "serve/http_api.h"

#include <httplib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "serve/client_socket.h"
#include "serve/prompt_bound.h"

namespace gmod::serve {

using nlohmann::json;

struct HttpApi::Impl {
  BatchEngine& engine;
  PromptBuilder build;
  std::shared_ptr<const Tokenizer> tokenizer;
  HttpOptions opt;
  httplib::Server server;
  std::atomic<int64_t> http_requests{0}, http_errors{0}, next_id{0};
  // Requests with a body over opt.large_body_bytes being handled now (at most opt.max_large_bodies), refusals.
  std::atomic<int64_t> large_bodies{0}, refused_large{0}, refused_by_bound{0};
  const std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

  Impl(BatchEngine& e, PromptBuilder b, std::shared_ptr<const Tokenizer> t, HttpOptions o)
      : engine(e), build(std::move(b)), tokenizer(std::move(t)), opt(std::move(o)) {}

  void error(httplib::Response& res, const ApiError& e) {
    ++http_errors;
    res.status = e.status;
    if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
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

  json chunk(const std::string& id, int64_t created, const json& delta, const json& finish) const {
    return {
        {"id", id},
        {"object", "chat.completion.chunk"},
        {"created", created},
        {"model", opt.model_name},
        {"choices",
         json::array({{{"index", 0}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", finish}}})}};
  }
  static std::string event(const json& j) { return "data: " + j.dump() + "\n\n"; }

  // The response of a stream: true request, written by httplib's chunked provider on the request's HTTP
  // thread: a role chunk, one chunk per piece of final text as the decoding thread produces it, the finish
  // chunk (and a usage chunk when asked), "data: [DONE]". Waiting, it checks every 200 ms whether the client
  // is gone; a failed write (closed, or no progress within the write timeout) ends the response. Either
  // cancels the request.
  struct Streamer {
    Impl* api;
    std::shared_ptr<RequestState> state;
    ClientSocket client;
    std::string id;
    int64_t created;
    bool include_usage;
    bool started = false;
    std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();

    bool operator()(httplib::DataSink& sink) {
      auto write = [&](const std::string& s) {
        last_write = std::chrono::steady_clock::now();
        return sink.write(s.data(), s.size());
      };
      if (!started) {
        started = true;
        return write(event(api->chunk(id, created, {{"role", "assistant"}, {"content", ""}}, nullptr)));
      }
      // Checked at every call, not only when idle: a write to a peer that has closed may still succeed.
      if (client.gone()) return false;
      RequestState::Update u = state->take(std::chrono::milliseconds(200));
      if (!u.delta.empty() && !write(event(api->chunk(id, created, {{"content", u.delta}}, nullptr))))
        return false;
      if (u.done) {
        std::string tail;
        if (u.error) {
          try {
            std::rethrow_exception(u.error);
          } catch (const ApiError& e) {
            tail = "data: " + e.to_json() + "\n\n";
          } catch (const std::exception& e) {
            tail = "data: " + ApiError(500, "server_error", e.what()).to_json() + "\n\n";
          }
          ++api->http_errors;
        } else {
          const Completion& c = *u.result;
          tail = event(api->chunk(id, created, json::object(), c.finish_reason));
          if (include_usage) {
            json j = api->chunk(id, created, json::object(), nullptr);
            j["choices"] = json::array();
            j["usage"] = {{"prompt_tokens", c.prompt_tokens},
                          {"completion_tokens", c.completion_tokens},
                          {"total_tokens", c.prompt_tokens + c.completion_tokens}};
            tail += event(j);
          }
        }
        if (!write(tail + "data: [DONE]\n\n")) return false;
        sink.done();
        return true;
      }
      // A comment line now and then: keeps proxies from timing out, and a write to a closed peer fails.
      if (std::chrono::steady_clock::now() - last_write > std::chrono::seconds(5))
        return write(": waiting\n\n");
      return true;
    }
  };

  // A body is JSON: a Content-Type other than application/json (or none, as some clients send) is 415.
  static void check_content_type(const httplib::Request& req) {
    std::string ct = req.get_header_value("Content-Type");
    for (char& c : ct) c = char(std::tolower(static_cast<unsigned char>(c)));
    const std::string media = ct.substr(0, ct.find(';'));
    const auto trimmed = media.substr(0, media.find_last_not_of(" \t") + 1);
    if (!ct.empty() && trimmed != "application/json")
      throw ApiError(415, "invalid_request_error",
                     "Content-Type '" + req.get_header_value("Content-Type") +
                         "' is not JSON: send the request body as application/json",
                     {}, "unsupported_media_type");
  }

  // Counts a large body in flight for as long as it lives. Its end hands the freed memory back to the system:
  // glibc keeps what the body's parse freed in its per-thread arenas, which stayed resident after a load.
  struct LargeBody {
    std::atomic<int64_t>* n = nullptr;
    ~LargeBody() {
      if (!n) return;
      --*n;
#ifdef __GLIBC__
      malloc_trim(0);
#endif
    }
  };

  // Takes one of the --max-large-bodies slots into `large`; all taken: the 503 to answer.
  std::optional<ApiError> take_large_slot(LargeBody& large) {
    if (++large_bodies > opt.max_large_bodies) {
      --large_bodies;
      ++refused_large;
      return ApiError(503, "server_error",
                      "busy: " + std::to_string(opt.max_large_bodies) + " requests with a body over " +
                          std::to_string(opt.large_body_bytes >> 20) +
                          " MiB are being handled (--max-large-bodies); retry",
                      {}, "server_busy");
    }
    large.n = &large_bodies;
    return std::nullopt;
  }

  // Reads the body itself (httplib's content reader), so a request is refused before its body is in memory: a
  // non-JSON Content-Type, and a large body (by its Content-Length, or once a chunked one grows past
  // large_body_bytes) while the --max-large-bodies slots are taken. A refused body is still read to its end,
  // in httplib's buffer-sized pieces that are dropped, so the client (which sends it before reading the
  // answer) gets the answer rather than a reset connection; bodies in memory are at most max_large_bodies
  // large ones plus one small one per HTTP thread.
  void chat_post(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
    std::optional<ApiError> refused;
    try {
      check_content_type(req);
    } catch (const ApiError& e) {
      refused = e;
    }
    LargeBody large;
    const uint64_t declared = req.get_header_value<uint64_t>("Content-Length");
    if (!refused && declared > opt.large_body_bytes && declared <= opt.max_body_bytes)
      refused = take_large_slot(large);
    std::string body;
    if (!refused && declared <= opt.max_body_bytes)
      body.reserve(declared);  // one allocation, not a doubling series
    bool too_large = false;
    size_t seen = 0;
    const bool read = reader([&](const char* data, size_t n) {
      // A chunked body's size is checked here (httplib checks only a Content-Length): reading stops.
      seen += n;
      if (seen > opt.max_body_bytes) {
        too_large = true;
        return false;
      }
      if (refused) return true;  // dropped: read only to keep the connection in step
      if (!large.n && body.size() + n > opt.large_body_bytes) {
        refused = take_large_slot(large);
        if (refused) {
          std::string().swap(body);
          return true;
        }
      }
      body.append(data, n);
      return true;
    });
    if (!read) {
      if (too_large || res.status == 413)  // over the payload limit
        throw ApiError(
            413, "invalid_request_error",
            "the body is over the server's limit of " + std::to_string(opt.max_body_bytes) + " bytes");
      throw ApiError(400, "invalid_request_error", "the request body could not be read to its end");
    }
    if (refused) throw *refused;
    chat(req, body, res);
  }

  void chat(const httplib::Request& req, const std::string& body, httplib::Response& res) {
    const ChatRequest r = parse_chat_request(body, opt.limits);
    // Text that cannot fit is refused before the prompt is built (which tokenizes all of it): the bound reads at
    // most about the context's worth of each message.
    size_t text_bytes = 0;
    for (const auto& m : r.messages) text_bytes += m.text.size();
    if (text_bytes > opt.bound_check_bytes) {
      const int64_t context = engine.options().context;
      int64_t bound = 0;
      for (const auto& m : r.messages) {
        const TokenBound b = token_lower_bound(*tokenizer, m.text, context - bound);
        bound += std::max<int64_t>(0, b.tokens - 1);  // a message's edges may merge with the template's text
        if (bound > context) break;
      }
      if (bound > context) {
        ++refused_by_bound;
        throw ApiError(400, "invalid_request_error",
                       "the messages' text (" + std::to_string(text_bytes) + " bytes) is more than " +
                           std::to_string(context) + " tokens, the model's context, before any image or " +
                           "template token (counted until past the context, the rest not read)",
                       "messages", "context_length_exceeded");
      }
    }
    if (!r.model.empty() && r.model != opt.model_name)
      throw ApiError(
          404, "invalid_request_error",
          "the model '" + r.model + "' is not served here (this server serves '" + opt.model_name + "')",
          "model", "model_not_found");
    std::shared_ptr<RequestState> state = engine.submit(build(r), r, tokenizer);
    const ClientSocket client(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
    const std::string id = "chatcmpl-" + std::to_string(++next_id);
    const int64_t created =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    if (r.stream) {
      auto streamer = std::make_shared<Streamer>(Streamer{this, state, client, id, created, r.include_usage});
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [streamer](size_t, httplib::DataSink& sink) {
            const bool ok = (*streamer)(sink);
            if (!ok) streamer->state->cancel();
            return ok;
          },
          [state](bool success) {
            if (!success) state->cancel();  // client gone or too slow: the engine drops the request
          });
      return;
    }
    for (;;) {
      RequestState::Update u = state->take(std::chrono::milliseconds(200));
      if (u.done) {
        if (u.error) std::rethrow_exception(u.error);
        res.set_content(completion_json(*u.result, id, created).dump(), "application/json");
        return;
      }
      if (client.gone()) {
        state->cancel();
        res.status = 499;  // nobody reads it: the client closed the connection
        return;
      }
    }
  }

  std::string metrics() const {
    const EngineMetrics m = engine.metrics();
    const double up = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    char buf[2048];
    std::snprintf(buf, sizeof buf,
                  "# gmod serve metrics (Prometheus text format)\n"
                  "gmod_http_requests_total %lld\ngmod_http_errors_total %lld\n"
                  "gmod_requests_completed_total %lld\ngmod_requests_cancelled_total "
                  "%lld\ngmod_batches_total %lld\ngmod_joins_total %lld\ngmod_decode_steps_total %lld\n"
                  "gmod_active_requests %lld\ngmod_max_batch_size %lld\n"
                  "gmod_prompt_tokens_total %lld\ngmod_completion_tokens_total %lld\n"
                  "gmod_decode_seconds_total %.6f\ngmod_decode_tokens_per_second %.3f\n"
                  "gmod_mod_skip_ratio %.6f\ngmod_queue_length %zu\ngmod_uptime_seconds %.3f\n"
                  "gmod_large_bodies_in_flight %lld\ngmod_refused_large_bodies_total %lld\n"
                  "gmod_refused_by_length_total %lld\n",
                  static_cast<long long>(http_requests.load()), static_cast<long long>(http_errors.load()),
                  static_cast<long long>(m.requests), static_cast<long long>(m.cancelled),
                  static_cast<long long>(m.batches), static_cast<long long>(m.joins),
                  static_cast<long long>(m.steps), static_cast<long long>(m.active_rows),
                  static_cast<long long>(m.max_batch_seen),
                  static_cast<long long>(m.prompt_tokens), static_cast<long long>(m.completion_tokens),
                  m.decode_seconds, m.decode_seconds > 0 ? m.completion_tokens / m.decode_seconds : 0.0,
                  m.mod_total ? 1.0 - double(m.mod_processed) / m.mod_total : 0.0, m.queue_length, up,
                  static_cast<long long>(large_bodies.load()), static_cast<long long>(refused_large.load()),
                  static_cast<long long>(refused_by_bound.load()));
    return buf;
  }

  // Runs a handler; any exception becomes a JSON error and the server carries on.
  template <class F>
  void guard(httplib::Response& res, F f) {
    ++http_requests;
    try {
      f();
    } catch (const ApiError& e) {
      error(res, e);
    } catch (const std::exception& e) {
      error(res, ApiError(500, "server_error", e.what()));
    }
  }
  template <class F>
  httplib::Server::Handler guarded(F f) {
    return
        [this, f](const httplib::Request& req, httplib::Response& res) { guard(res, [&] { f(req, res); }); };
  }

  void routes() {
    // Enough HTTP threads for every request the engine can hold (decoding + queued) and a few more, so that a
    // request over the queue is answered 429 at once instead of waiting for a thread.
    const size_t threads = size_t(engine.options().max_batch) + engine.options().max_queue + 4;
    server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    server.set_payload_max_length(opt.max_body_bytes);
    server.set_write_timeout(opt.write_timeout_s, 0);
    server.set_read_timeout(opt.read_timeout_s, 0);
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
    server.Post("/v1/chat/completions",
                [this](const httplib::Request& q, httplib::Response& s, const httplib::ContentReader& r) {
                  guard(s, [&] { chat_post(q, s, r); });
                });
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

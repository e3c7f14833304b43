// `gmod serve`: an OpenAI-compatible HTTP server (/v1/chat/completions, /v1/models, /health, /metrics) for a
// dense or γ-MoD model; requests are queued and decoded by one thread that admits them into the running batch between
// decode steps (continuous batching, serve/batch_engine.h, docs/serve.md).
// Serves until SIGINT or SIGTERM.
#include <pthread.h>

#include <csignal>
#include <filesystem>
#include <iostream>
#include <thread>

#include "data/image.h"
#include "launch/cli_model.h"
#include "serve/http_api.h"

namespace gmod::cli {
namespace {

struct ServeCliOptions {
  ModelOptions model;
  TextOptions text;
  std::string host = "127.0.0.1";
  int port = 8000;
  int max_batch = 8;
  int max_queue = 64;
  int64_t max_new_tokens = 256;
  std::string api_key;
  std::string name;
  int64_t max_image_pixels = kDefaultMaxImagePixels;
  int max_images = 8;
  std::string allowed_image_dir;
  int write_timeout = 10;
  int max_large_bodies = 4;
};

int run_serve(const ServeCliOptions& o) {
  // SIGINT/SIGTERM are waited for by one thread (below); every thread started from here inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  CliModel m = load_cli_model(o.model);
  std::shared_ptr<const Tokenizer> tok = load_cli_tokenizer(o.text, m);
  const DatasetConfig dc = cli_dataset_config(o.text, m, tok);
  auto enc = std::make_shared<ConversationEncoder>(tok, dc.conversation);

  serve::EngineOptions eo;
  eo.max_batch = o.max_batch;
  eo.max_queue = size_t(o.max_queue);
  eo.max_new_tokens = o.max_new_tokens;
  eo.context = m.model->config.text.max_position_embeddings;
  eo.eos_id = enc->end_of_turn_id().value_or(-1);  // the template's turn end (<|eot_id|>, <|im_end|>, </s>)
  eo.pad_id = enc->pad_id();
  eo.device = m.device;
  eo.dtype = m.dtype;
  serve::BatchEngine engine(m.model, eo);

  serve::HttpOptions ho;
  ho.host = o.host;
  ho.port = o.port;
  ho.api_key = o.api_key;
  ho.model_name =
      !o.name.empty() ? o.name : std::filesystem::path(m.dir).lexically_normal().filename().string();
  if (ho.model_name.empty())
    ho.model_name = std::filesystem::path(m.dir).lexically_normal().parent_path().filename().string();
  ho.limits.max_images = size_t(o.max_images);
  ho.max_image_pixels = o.max_image_pixels;
  ho.write_timeout_s = o.write_timeout;
  ho.max_large_bodies = o.max_large_bodies;
  if (!o.allowed_image_dir.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_directory(o.allowed_image_dir, ec))
      throw std::runtime_error("--allowed-image-dir '" + o.allowed_image_dir + "' is not a folder");
    ho.limits.allowed_image_dir = std::filesystem::absolute(o.allowed_image_dir).string();
  }
  const bool vision = bool(m.model->vision);
  serve::HttpApi api(
      engine,
      [enc, dc, vision, px = o.max_image_pixels](const serve::ChatRequest& r) {
        return serve::prepare_prompt(r, *enc, dc, vision, px);
      },
      tok, ho);
  const int port = api.bind();
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    std::cout << "gmod serve: signal " << sig << ", stopping" << std::endl;
    api.stop();
  });
  std::cout << "gmod serve: model " << ho.model_name << " ("
            << (m.mod_layers.empty() ? "dense"
                                     : "γ-MoD, " + std::to_string(m.mod_layers.size()) + " MoD layers")
            << "), max batch " << o.max_batch << ", queue " << o.max_queue
            << (o.api_key.empty() ? "" : ", API key") << "\ngmod serve: listening on http://" << o.host << ":"
            << port << std::endl;
  const bool ok = api.serve();
  if (!ok) {
    pthread_kill(waiter.native_handle(), SIGTERM);  // wake the waiter, whatever the reason serve() ended
  }
  waiter.join();
  if (!ok)
    throw std::runtime_error("the listening socket on " + o.host + ":" + std::to_string(port) + " failed");
  std::cout << "gmod serve: stopped" << std::endl;
  return kExitOk;
}

Runner setup_serve(CLI::App& app) {
  auto o = std::make_shared<ServeCliOptions>();
  add_model_options(app, o->model);
  add_text_options(app, o->text, /*with_max_len=*/false);
  add(app, "--host", o->host, "address to listen on (127.0.0.1: this machine only)");
  add(app, "--port", o->port, "TCP port (0: any free port, printed when listening)")
      ->check(between(0, 65535));
  add(app, "--max-batch", o->max_batch, "requests decoded together at most (new ones join the running batch between steps)")->check(between(1, 1024));
  add(app, "--max-queue", o->max_queue, "waiting requests at most; more get HTTP 429")
      ->check(between(1, 1 << 20));
  add(app, "--max-new-tokens", o->max_new_tokens,
      "a request's default max_tokens, and its limit (a larger max_tokens is answered 400)")
      ->check(positive());
  add(app, "--api-key", o->api_key, "require 'Authorization: Bearer KEY' (default: no key)")
      ->type_name("KEY");
  add(app, "--name", o->name,
      "the model id in /v1/models and responses (default: the --model folder's name)");
  add(app, "--max-image-pixels", o->max_image_pixels, "decoded pixels (width x height) per image at most")
      ->check(positive());
  add(app, "--max-images", o->max_images, "images per request at most")->check(between(1, 64));
  add(app, "--allowed-image-dir", o->allowed_image_dir,
      "serve image_url local paths (file:///..., /..., or relative) from under this folder only (default: "
      "local paths refused)")
      ->type_name("DIR");
  add(app, "--write-timeout", o->write_timeout,
      "seconds a client may take no response bytes before it is cut off and its request cancelled")
      ->check(between(1, 3600));
  add(app, "--max-large-bodies", o->max_large_bodies,
      "requests with a body over 1 MiB handled at once at most (more: 503 with Retry-After)")
      ->check(between(1, 1024));
  return [o] { return run_serve(*o); };
}

Register reg_serve({"serve", "serve a dense or γ-MoD model over an OpenAI-compatible HTTP API", setup_serve});

}  // namespace
}  // namespace gmod::cli

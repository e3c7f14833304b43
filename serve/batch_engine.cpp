#include "serve/batch_engine.h"

#include <chrono>

#include "mod/generate.h"

namespace gmod::serve {

namespace {
std::exception_ptr api_error(int status, const std::string& type, const std::string& message) {
  return std::make_exception_ptr(ApiError(status, type, message));
}
}  // namespace

BatchEngine::BatchEngine(std::shared_ptr<MultimodalLM> model, EngineOptions options)
    : model_(std::move(model)), opt_(std::move(options)) {
  thread_ = std::thread([this] { loop(); });
}

BatchEngine::~BatchEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (Job& j : queue_) j.state->fail(api_error(503, "server_error", "the server is shutting down"));
}

std::shared_ptr<RequestState> BatchEngine::submit(PreparedPrompt prompt, const ChatRequest& request,
                                                  std::shared_ptr<const Tokenizer> tokenizer) {
  Job job;
  job.max_tokens = std::min(request.max_tokens.value_or(opt_.max_new_tokens), opt_.max_new_tokens);
  const int64_t need = int64_t(prompt.ids.size()) + job.max_tokens;
  if (need > opt_.context)
    throw ApiError(400, "invalid_request_error",
                   "the prompt (" + std::to_string(prompt.ids.size()) +
                       " tokens with its image tokens) plus " + std::to_string(job.max_tokens) +
                       " new tokens (max_tokens, at most --max-new-tokens " +
                       std::to_string(opt_.max_new_tokens) + ") is " + std::to_string(need) +
                       ", over the model's context of " + std::to_string(opt_.context) + " tokens",
                   "messages", "context_length_exceeded");
  // As gmod generate: temperature or top_p given -> sampling (temperature 0 -> greedy).
  if ((request.temperature || request.top_p) && request.temperature.value_or(1.0) > 0) {
    job.sampling.greedy = false;
    job.sampling.temperature = request.temperature.value_or(1.0);
    job.sampling.top_p = request.top_p.value_or(1.0);
    job.sampling.seed = request.seed;
  }
  job.answer = std::make_unique<AnswerText>(std::move(tokenizer), request.stop, job.max_tokens, opt_.eos_id);
  job.prompt = std::move(prompt);
  job.state = std::make_shared<RequestState>();
  std::shared_ptr<RequestState> state = job.state;
  {
    std::lock_guard<std::mutex> lock(mu_);
    drop_cancelled_locked();
    if (queue_.size() >= opt_.max_queue)
      throw ApiError(429, "rate_limit_error",
                     "the server's queue is full (" + std::to_string(opt_.max_queue) +
                         " waiting requests); retry later");
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
  return state;
}

void BatchEngine::drop_cancelled_locked() {
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (it->state->cancelled()) {
      it->state->fail(api_error(499, "invalid_request_error", "the client closed the connection"));
      ++metrics_.cancelled;
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
}

EngineMetrics BatchEngine::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineMetrics m = metrics_;
  m.queue_length = queue_.size();
  return m;
}

void BatchEngine::loop() {
  for (;;) {
    std::vector<Job> jobs;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      drop_cancelled_locked();
      if (queue_.empty()) continue;
      const Sampling key = queue_.front().sampling;
      for (auto it = queue_.begin(); it != queue_.end() && int(jobs.size()) < opt_.max_batch;) {
        if (it->sampling == key) {
          jobs.push_back(std::move(*it));
          it = queue_.erase(it);
        } else {
          ++it;
        }
      }
    }
    try {
      run_batch(jobs);
    } catch (const std::exception& e) {
      for (Job& j : jobs)
        j.state->fail(api_error(500, "server_error", std::string("decoding failed: ") + e.what()));
    }
  }
}

bool BatchEngine::step(Job& j, int64_t id) {
  if (j.cancelled || j.failed || j.answer->finished()) return false;
  if (j.state->cancelled()) {
    j.cancelled = true;
    j.state->fail(api_error(499, "invalid_request_error", "the client closed the connection"));
    return false;
  }
  try {
    j.state->append(j.answer->add(id));
  } catch (const std::exception& e) {
    // E.g. an id the tokenizer does not have: this request fails, not its batch.
    j.failed = true;
    j.state->fail(api_error(500, "server_error", std::string("decoding failed: ") + e.what()));
    return false;
  }
  if (!j.answer->finished()) return true;
  j.state->complete(j.answer->completion(int64_t(j.prompt.ids.size())));
  return false;
}

void BatchEngine::run_batch(std::vector<Job>& jobs) {
  const int64_t B = int64_t(jobs.size());
  int64_t L = 0, max_tokens = 0;
  std::vector<at::Tensor> pixels;
  for (const Job& j : jobs) {
    L = std::max<int64_t>(L, int64_t(j.prompt.ids.size()));
    max_tokens = std::max(max_tokens, j.max_tokens);
    if (j.prompt.pixels.defined()) pixels.push_back(j.prompt.pixels);
  }
  ModelInputs in;
  in.input_ids = at::full({B, L}, opt_.pad_id, at::kLong);
  in.token_roles = at::zeros({B, L}, at::kChar);  // TokenRole::kPad
  in.attention_mask = at::zeros({B, L}, at::kBool);
  for (int64_t b = 0; b < B; ++b) {
    const PreparedPrompt& p = jobs[size_t(b)].prompt;
    const int64_t n = int64_t(p.ids.size());
    in.input_ids[b].narrow(0, 0, n).copy_(at::from_blob(const_cast<int64_t*>(p.ids.data()), {n}, at::kLong));
    in.token_roles[b].narrow(0, 0, n).copy_(
        at::from_blob(const_cast<int8_t*>(p.roles.data()), {n}, at::kChar));
    in.attention_mask[b].narrow(0, 0, n).fill_(true);
  }
  if (!pixels.empty()) in.pixel_values = at::cat(pixels).to(opt_.device, opt_.dtype);
  in.input_ids = in.input_ids.to(opt_.device);
  in.token_roles = in.token_roles.to(opt_.device);
  in.attention_mask = in.attention_mask.to(opt_.device);

  GenerateOptions g;
  g.max_new_tokens = max_tokens;
  g.greedy = jobs[0].sampling.greedy;
  g.temperature = jobs[0].sampling.temperature;
  g.top_p = jobs[0].sampling.top_p;
  g.seed = jobs[0].sampling.seed;
  g.eos_token_id = opt_.eos_id;
  g.pad_token_id = opt_.pad_id;
  // Each step's tokens go to their requests at once (streaming); the batch ends when none is left running.
  // A finished or cancelled request's row keeps being computed until then (leaving the batch for real needs
  // the stepwise decoder, docs/serve.md).
  g.on_step = [&](int64_t, const at::Tensor& next) {
    const at::Tensor ids = next.to(at::kCPU, at::kLong).contiguous();
    const int64_t* p = ids.data_ptr<int64_t>();
    bool running = false;
    for (int64_t b = 0; b < B; ++b) running = step(jobs[size_t(b)], p[b]) || running;
    return running;
  };
  const auto t0 = std::chrono::steady_clock::now();
  const GenerateResult r = generate(*model_, in, g);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int64_t generated = 0, prompt_tokens = 0, completed = 0, cancelled = 0;
  for (Job& j : jobs) {
    if (j.failed) continue;
    if (!j.cancelled && !j.answer->finished()) {  // generation ended first (every sample at EOS)
      j.state->append(j.answer->end());
      j.state->complete(j.answer->completion(int64_t(j.prompt.ids.size())));
    }
    const Completion c = j.answer->completion(int64_t(j.prompt.ids.size()));
    generated += c.completion_tokens;
    prompt_tokens += c.prompt_tokens;
    (j.cancelled ? cancelled : completed) += 1;
  }
  std::lock_guard<std::mutex> lock(mu_);
  metrics_.requests += completed;
  metrics_.cancelled += cancelled;
  metrics_.batches += 1;
  metrics_.prompt_tokens += prompt_tokens;
  metrics_.completion_tokens += generated;
  metrics_.decode_seconds += seconds;
  metrics_.mod_processed += r.compute.mod_processed;
  metrics_.mod_total += r.compute.mod_total;
  metrics_.max_batch_seen = std::max(metrics_.max_batch_seen, B);
}

}  // namespace gmod::serve

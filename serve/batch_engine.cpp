#include "serve/batch_engine.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
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
  for (JobPtr& j : queue_) j->state->fail(api_error(503, "server_error", "the server is shutting down"));
}

std::shared_ptr<RequestState> BatchEngine::submit(PreparedPrompt prompt, const ChatRequest& request,
                                                  std::shared_ptr<const Tokenizer> tokenizer) {
  auto job = std::make_unique<Job>();
  // max_tokens over --max-new-tokens is refused, not clamped: a client asking for more than the server gives is told.
  if (request.max_tokens && *request.max_tokens > opt_.max_new_tokens)
    throw ApiError(400, "invalid_request_error",
                   "max_tokens " + std::to_string(*request.max_tokens) + " is over this server's limit of " +
                       std::to_string(opt_.max_new_tokens) + " new tokens (gmod serve --max-new-tokens)",
                   "max_tokens", "max_tokens_exceeded");
  job->max_tokens = request.max_tokens.value_or(opt_.max_new_tokens);
  const int64_t need = int64_t(prompt.ids.size()) + job->max_tokens;
  if (need > opt_.context)
    throw ApiError(400, "invalid_request_error",
                   "the prompt (" + std::to_string(prompt.ids.size()) +
                       " tokens with its image tokens) plus " + std::to_string(job->max_tokens) +
                       " new tokens (max_tokens, default --max-new-tokens " +
                       std::to_string(opt_.max_new_tokens) + ") is " + std::to_string(need) +
                       ", over the model's context of " + std::to_string(opt_.context) + " tokens",
                   "messages", "context_length_exceeded");
  // As gmod generate: temperature or top_p given -> sampling (temperature 0 -> greedy).
  if ((request.temperature || request.top_p) && request.temperature.value_or(1.0) > 0) {
    job->sampling.greedy = false;
    job->sampling.temperature = request.temperature.value_or(1.0);
    job->sampling.top_p = request.top_p.value_or(1.0);
    job->sampling.seed = request.seed;
    job->gen = at::make_generator<at::CPUGeneratorImpl>(request.seed);
  }
  job->answer =
      std::make_unique<AnswerText>(std::move(tokenizer), request.stop, job->max_tokens, opt_.eos_id);
  job->prompt = std::move(prompt);
  job->state = std::make_shared<RequestState>();
  std::shared_ptr<RequestState> state = job->state;
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
    if ((*it)->state->cancelled()) {
      (*it)->state->fail(api_error(499, "invalid_request_error", "the client closed the connection"));
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

BatchEngine::JobPtr BatchEngine::take_waiting(const DecodeBatch& batch, int64_t running, bool* stop) {
  std::unique_lock<std::mutex> lock(mu_);
  if (running == 0) cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
  *stop = stopping_;
  if (stopping_) return nullptr;
  drop_cancelled_locked();
  if (queue_.empty() || running >= opt_.max_batch) return nullptr;
  // Arrival order: a request that does not fit beside the running batch waits, and those behind it too, so
  // that a long prompt is not overtaken for ever; it fits once the batch has drained.
  const Job& j = *queue_.front();
  if (!batch.fits(int64_t(j.prompt.ids.size()), j.max_tokens)) return nullptr;
  JobPtr taken = std::move(queue_.front());
  queue_.pop_front();
  return taken;
}

namespace {
// One prompt as ModelInputs [1, L] on the device.
ModelInputs prompt_inputs(const PreparedPrompt& p, const EngineOptions& opt) {
  const int64_t n = int64_t(p.ids.size());
  ModelInputs in;
  in.input_ids = at::from_blob(const_cast<int64_t*>(p.ids.data()), {1, n}, at::kLong).to(opt.device);
  in.token_roles = at::from_blob(const_cast<int8_t*>(p.roles.data()), {1, n}, at::kChar).to(opt.device);
  in.attention_mask = at::ones({1, n}, at::TensorOptions().dtype(at::kBool).device(opt.device));
  if (p.pixels.defined()) in.pixel_values = p.pixels.to(opt.device, opt.dtype);
  if (p.image_grid_thw.defined()) in.image_grid_thw = p.image_grid_thw.to(opt.device);
  if (p.image_sizes.defined()) in.image_sizes = p.image_sizes;  // AnyRes: on the host, read to pack the tiles
  return in;
}
}  // namespace

int64_t BatchEngine::choose_one(const at::Tensor& logits, Job& j) {
  if (j.sampling.greedy) return logits.argmax(-1).item<int64_t>();
  GenerateOptions g;
  g.greedy = false;
  g.temperature = j.sampling.temperature;
  g.top_p = j.sampling.top_p;
  return choose_next_tokens(logits, g, j.gen).item<int64_t>();
}

std::vector<int64_t> BatchEngine::choose(const at::Tensor& logits, const std::vector<JobPtr>& rows) {
  const at::Tensor greedy = logits.argmax(-1).to(at::kCPU).contiguous();
  std::vector<int64_t> ids(greedy.data_ptr<int64_t>(), greedy.data_ptr<int64_t>() + greedy.numel());
  for (size_t r = 0; r < rows.size(); ++r)
    if (rows[r] && !rows[r]->sampling.greedy) ids[r] = choose_one(logits.narrow(0, int64_t(r), 1), *rows[r]);
  return ids;
}

bool BatchEngine::deliver(Job& j, int64_t id) {
  if (j.cancelled || j.failed || j.answer->finished()) return false;
  if (j.state->cancelled()) {
    j.cancelled = true;
    j.state->fail(api_error(499, "invalid_request_error", "the client closed the connection"));
    return false;
  }
  try {
    j.state->append(j.answer->add(id));
  } catch (const std::exception& e) {
    // E.g. an id the tokenizer does not have: this request fails, not the batch.
    j.failed = true;
    j.state->fail(api_error(500, "server_error", std::string("decoding failed: ") + e.what()));
    return false;
  }
  j.last = id;
  if (!j.answer->finished()) return true;
  j.state->complete(j.answer->completion(int64_t(j.prompt.ids.size())));
  return false;
}

void BatchEngine::finish(Job& j) {
  if (j.failed) return;
  const Completion c = j.answer->completion(int64_t(j.prompt.ids.size()));
  std::lock_guard<std::mutex> lock(mu_);
  (j.cancelled ? metrics_.cancelled : metrics_.requests) += 1;
  metrics_.prompt_tokens += c.prompt_tokens;
  metrics_.completion_tokens += c.completion_tokens;
}

void BatchEngine::loop() {
  DecodeBatchOptions bo;
  bo.context = opt_.context;
  auto batch = std::make_unique<DecodeBatch>(*model_, bo);
  std::vector<JobPtr> rows;  // the job of each batch row; null: released
  int64_t running = 0;
  ComputeReport done;  // MoD counts of decoders replaced after a failure
  auto fail_all = [&](const std::exception_ptr& e) {
    for (JobPtr& j : rows)
      if (j) {
        if (!j->cancelled && !j->failed && !j->answer->finished()) j->state->fail(e);
        j->failed = true;
      }
    rows.clear();
    running = 0;
    done.add(batch->compute());
    batch = std::make_unique<DecodeBatch>(*model_, bo);
  };
  auto account = [&](double seconds, int64_t steps) {
    ComputeReport all = done;
    all.add(batch->compute());
    std::lock_guard<std::mutex> lock(mu_);
    metrics_.decode_seconds += seconds;
    metrics_.steps += steps;
    metrics_.mod_processed = all.mod_processed;
    metrics_.mod_total = all.mod_total;
    metrics_.active_rows = running;
    metrics_.max_batch_seen = std::max(metrics_.max_batch_seen, running);
  };
  // A row's request ended: out of the batch at once (and counted).
  auto end_row = [&](size_t r) {
    finish(*rows[r]);
    rows[r].reset();
    batch->release(int64_t(r));
    if (--running == 0) {
      rows.clear();
      std::lock_guard<std::mutex> lock(mu_);
      metrics_.batches += 1;
    }
  };
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    bool stop = false;
    // Waiting requests join between steps: each its own prefill, into a free row or a new one.
    while (JobPtr j = take_waiting(*batch, running, &stop)) {
      const bool join = running > 0;
      DecodeBatch::Admitted a;
      try {
        a = batch->admit(prompt_inputs(j->prompt, opt_), j->max_tokens);
      } catch (const std::exception& e) {
        // This request's prefill failed (e.g. its image): it alone is answered. A row it may have taken is not
        // active; the compaction below drops it.
        j->state->fail(api_error(500, "server_error", std::string("decoding failed: ") + e.what()));
        rows.resize(std::max(rows.size(), size_t(batch->rows())));
        continue;
      }
      const size_t r = size_t(a.rows[0]);
      if (rows.size() <= r) rows.resize(r + 1);
      rows[r] = std::move(j);
      ++running;
      if (join) {
        std::lock_guard<std::mutex> lock(mu_);
        metrics_.joins += 1;
      }
      if (!deliver(*rows[r], choose_one(a.logits, *rows[r]))) end_row(r);
    }
    if (stop) break;
    if (running == 0) {
      account(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0);
      continue;
    }
    // Rows released and not taken again: out of the step (one copy of the caches).
    if (int64_t(rows.size()) > running) {
      const std::vector<int64_t> map = batch->compact();
      std::vector<JobPtr> moved(static_cast<size_t>(running));
      for (size_t r = 0; r < rows.size(); ++r)
        if (rows[r]) moved[size_t(map[r])] = std::move(rows[r]);
      rows = std::move(moved);
    }
    try {
      std::vector<int64_t> last(rows.size());
      for (size_t r = 0; r < rows.size(); ++r) last[r] = rows[r]->last;
      const at::Tensor logits = batch->step(at::tensor(last, at::kLong).to(opt_.device));
      const std::vector<int64_t> next = choose(logits, rows);
      for (size_t r = 0; r < rows.size(); ++r)
        if (rows[r] && !deliver(*rows[r], next[r])) end_row(r);
    } catch (const std::exception& e) {
      fail_all(api_error(500, "server_error", std::string("decoding failed: ") + e.what()));
    }
    account(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1);
  }
  fail_all(api_error(503, "server_error", "the server is shutting down"));
}

}  // namespace gmod::serve

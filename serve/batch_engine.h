// `gmod serve`: the request queue and the one decoding thread. HTTP threads submit prepared prompts; the
// decoding thread takes what is waiting (up to max_batch requests that share sampling settings), decodes them
// as one right-padded batch with mod/generate.h (γ-MoD per-layer KV caches), and fulfils each request's
// future. A batch runs to its end before the next starts: requests arriving meanwhile wait (continuous
// batching, joining a running batch, is not done yet; docs/serve.md).
#pragma once

#include <condition_variable>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "data/tokenizer.h"
#include "model/llava.h"
#include "serve/chat_prompt.h"

namespace gmod::serve {

struct EngineOptions {
  int max_batch = 8;
  size_t max_queue = 64;         // waiting requests; more are refused (HTTP 429)
  int64_t max_new_tokens = 256;  // default and cap of a request's max_tokens
  int64_t context = 2048;        // the model's positions: prompt + max_tokens must fit
  int64_t eos_id = -1;
  int64_t pad_id = 0;
  at::Device device = at::kCPU;
  at::ScalarType dtype = at::kFloat;
};

// Sampling settings: requests batch together only when these are equal.
struct Sampling {
  bool greedy = true;
  double temperature = 1.0, top_p = 1.0;
  uint64_t seed = 0;
  bool operator==(const Sampling& o) const {
    return greedy == o.greedy && temperature == o.temperature && top_p == o.top_p && seed == o.seed;
  }
};

struct Completion {
  std::string text;
  std::string finish_reason;  // "stop" (EOS or a stop string) or "length"
  int64_t prompt_tokens = 0, completion_tokens = 0;
};

struct EngineMetrics {
  int64_t requests = 0;  // completed by the decoding thread
  int64_t batches = 0;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  double decode_seconds = 0;                 // wall time inside generate()
  int64_t mod_processed = 0, mod_total = 0;  // γ-MoD layers' token slots processed / offered
  size_t queue_length = 0;
  int64_t max_batch_seen = 0;
};

class BatchEngine {
 public:
  BatchEngine(std::shared_ptr<MultimodalLM> model, EngineOptions options);
  ~BatchEngine();  // stops the decoding thread; waiting requests fail with 503
  BatchEngine(const BatchEngine&) = delete;
  BatchEngine& operator=(const BatchEngine&) = delete;

  // Queues a request. Throws ApiError 400 (context_length_exceeded: prompt + max_tokens over the context) or
  // 429 (queue full). The future throws ApiError 500 when decoding fails.
  std::future<Completion> submit(PreparedPrompt prompt, const ChatRequest& request,
                                 std::shared_ptr<const Tokenizer> tokenizer);
  EngineMetrics metrics() const;
  const EngineOptions& options() const { return opt_; }

 private:
  struct Job {
    PreparedPrompt prompt;
    Sampling sampling;
    int64_t max_tokens = 0;
    std::vector<std::string> stop;
    std::shared_ptr<const Tokenizer> tokenizer;
    std::promise<Completion> done;
  };
  void loop();
  void run_batch(std::vector<Job>& jobs);

  std::shared_ptr<MultimodalLM> model_;
  EngineOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool stopping_ = false;
  EngineMetrics metrics_;
  std::thread thread_;
};

// Cuts `text` at the first occurrence of any stop string; true when one was found.
bool apply_stop(std::string& text, const std::vector<std::string>& stop);

}  // namespace gmod::serve

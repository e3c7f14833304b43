// `gmod serve`: the request queue and the one decoding thread. HTTP threads submit prepared prompts and get
// a RequestState; the decoding thread takes what is waiting (up to max_batch requests that share sampling
// settings; requests whose client left are dropped unrun), decodes them as one right-padded batch with
// mod/generate.h (γ-MoD per-layer KV caches), and at every step hands each request its new text (AnswerText)
// and reads its cancel flag. A request ends on its own (EOS, stop string, max_tokens, client gone); the batch
// ends when all of its requests have. Requests arriving meanwhile wait for the next batch: joining a running
// batch (continuous batching) needs a stepwise decoder in mod/ (docs/serve.md); the per-request state here is
// already independent of the batch it is decoded in.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "data/tokenizer.h"
#include "model/llava.h"
#include "serve/answer_text.h"
#include "serve/chat_prompt.h"
#include "serve/request_state.h"

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

struct EngineMetrics {
  int64_t requests = 0;   // completed by the decoding thread
  int64_t cancelled = 0;  // left by their client: while decoding, or dropped from the queue unrun
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
  // 429 (queue full, after dropping queued requests whose client left). The state ends with ApiError 500 when
  // decoding fails, 503 when the server stops first.
  std::shared_ptr<RequestState> submit(PreparedPrompt prompt, const ChatRequest& request,
                                       std::shared_ptr<const Tokenizer> tokenizer);
  EngineMetrics metrics() const;
  const EngineOptions& options() const { return opt_; }

 private:
  struct Job {
    PreparedPrompt prompt;
    Sampling sampling;
    int64_t max_tokens = 0;
    std::shared_ptr<RequestState> state;
    std::unique_ptr<AnswerText> answer;
    bool cancelled = false;
    bool failed = false;  // its text did not decode: answered 500, the batch goes on
  };
  void loop();
  void run_batch(std::vector<Job>& jobs);
  // A generated token for job b; false once the job has ended (its answer complete, or its client gone).
  bool step(Job& j, int64_t id);
  void drop_cancelled_locked();

  std::shared_ptr<MultimodalLM> model_;
  EngineOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool stopping_ = false;
  EngineMetrics metrics_;
  std::thread thread_;
};

}  // namespace gmod::serve

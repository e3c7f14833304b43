// `gmod serve`: the request queue and the one decoding thread, which runs continuous batching on the stepwise
// decoder (mod/decode_batch.h). HTTP threads submit prepared prompts and get a RequestState. Between two
// decode steps the decoding thread admits waiting requests into the running batch (each its own prefill, its
// KV caches placed into a free row; up to max_batch rows, in arrival order, while the context bound allows: a
// request that does not fit waits, and those behind it too, until the batch has drained), then feeds every
// running row's last token through one shared step. After each token a request gets its new text (AnswerText)
// and its cancel flag is read; a request that ended (EOS, stop string, max_tokens, client gone) leaves the
// batch at once: its row is released, and dropped before the next step unless a waiting request takes it.
// Each request samples with its own generator (seeded by its seed), so requests of any sampling settings
// share a batch and a seeded answer does not depend on who else is decoded.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "data/tokenizer.h"
#include "mod/decode_batch.h"
#include "model/llava.h"
#include "serve/answer_text.h"
#include "serve/chat_prompt.h"
#include "serve/request_state.h"

namespace gmod::serve {

struct EngineOptions {
  int max_batch = 8;
  size_t max_queue = 64;         // waiting requests; more are refused (HTTP 429)
  int64_t max_new_tokens = 256;  // default of a request's max_tokens, and its limit (more: 400)
  int64_t context = 2048;        // the model's positions: prompt + max_tokens must fit
  int64_t eos_id = -1;
  int64_t pad_id = 0;
  at::Device device = at::kCPU;
  at::ScalarType dtype = at::kFloat;
};

// A request's sampling settings.
struct Sampling {
  bool greedy = true;
  double temperature = 1.0, top_p = 1.0;
  uint64_t seed = 0;
  bool operator==(const Sampling& o) const {
    return greedy == o.greedy && temperature == o.temperature && top_p == o.top_p && seed == o.seed;
  }
};

struct EngineMetrics {
  int64_t requests = 0;     // completed by the decoding thread
  int64_t cancelled = 0;    // left by their client: while decoding, or dropped from the queue unrun
  int64_t batches = 0;      // runs of the decoder from an empty batch until it drained
  int64_t joins = 0;        // requests admitted into a batch that was already decoding
  int64_t steps = 0;        // decode steps (one token for every running request)
  int64_t active_rows = 0;  // requests decoding now
  int64_t prompt_tokens = 0, completion_tokens = 0;
  double decode_seconds = 0;                 // wall time in prefills and decode steps
  int64_t mod_processed = 0, mod_total = 0;  // γ-MoD layers' token slots processed / offered
  size_t queue_length = 0;
  int64_t max_batch_seen = 0;  // most requests decoding at once
};

class BatchEngine {
 public:
  BatchEngine(std::shared_ptr<MultimodalLM> model, EngineOptions options);
  ~BatchEngine();  // stops the decoding thread; waiting requests fail with 503
  BatchEngine(const BatchEngine&) = delete;
  BatchEngine& operator=(const BatchEngine&) = delete;

  // Queues a request. Throws ApiError 400 (context_length_exceeded: prompt + max_tokens over the context) or
  // 429 (queue full, after dropping queued requests whose client left). The state ends with ApiError 500 when
  // decoding fails, 503 when the server stops first (queued or decoding).
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
    bool failed = false;  // its text did not decode: answered 500, the others go on
    int64_t last = 0;     // its last token (fed at the next step)
    at::Generator gen;    // its own sampler (sampling.greedy false)
  };
  using JobPtr = std::unique_ptr<Job>;
  void loop();
  // The waiting request that joins now, if any (arrival order, while rows and the context bound allow);
  // blocks while nothing runs and nothing waits. *stop: the server is stopping.
  JobPtr take_waiting(const DecodeBatch& batch, int64_t running, bool* stop);
  int64_t choose_one(const at::Tensor& logits, Job& j);  // logits [1, V]
  // Next token of each running row from the step's logits [R, V] (greedy rows at once, sampled rows each with
  // their own generator).
  std::vector<int64_t> choose(const at::Tensor& logits, const std::vector<JobPtr>& rows);
  // A generated token for the job; false once the job has ended (its answer complete, or its client gone).
  bool deliver(Job& j, int64_t id);
  void finish(Job& j);  // counts an ended job in the metrics
  void drop_cancelled_locked();

  std::shared_ptr<MultimodalLM> model_;
  EngineOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<JobPtr> queue_;
  bool stopping_ = false;
  EngineMetrics metrics_;
  std::thread thread_;
};

}  // namespace gmod::serve

// `gmod serve`: what one request's HTTP thread and the decoding thread share: the answer's text as it is
// decoded (deltas the HTTP thread takes for server-sent events), its end (a Completion or an error), and the
// cancel flag the HTTP thread sets when the client has gone, which the decoding thread reads at every step.
// The decoding thread never waits for a client: pending text is at most one answer (max_tokens bounded).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <string>

namespace gmod::serve {

struct Completion {
  std::string text;
  std::string finish_reason;  // "stop" (EOS or a stop string) or "length"
  int64_t prompt_tokens = 0, completion_tokens = 0;
};

class RequestState {
 public:
  // Decoding thread.
  void append(const std::string& delta);
  void complete(Completion c);
  void fail(std::exception_ptr error);

  // HTTP thread: waits up to `timeout` for new text or the end and takes what came.
  struct Update {
    std::string delta;  // text since the last take
    bool done = false;  // then exactly one of result / error
    std::optional<Completion> result;
    std::exception_ptr error;
  };
  Update take(std::chrono::milliseconds timeout);

  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::string pending_;
  bool done_ = false;
  std::optional<Completion> result_;
  std::exception_ptr error_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace gmod::serve
